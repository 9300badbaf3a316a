//! What the cluster tests share: a redis-server of their own on a free loopback port, cluster
//! nodes (a broker joined to that Redis, each on a runtime of its own, so that a test can kill
//! one as a crash would) and MQTT clients. Every wait polls a condition up to a deadline.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use braid_broker::broker::Broker;
use braid_broker::config::ClusterConfig;
use braid_broker::report::Sample;
use braid_broker::{Config, Server};
use braid_client::{
    Client, ClientOptions, Event, Message, Properties, Publish, QoS, ReasonCode, SubscriptionOptions,
};
use braid_cluster::Node;
use redis::aio::MultiplexedConnection;

/// How long a test waits for what should happen.
pub(crate) const WAIT: Duration = Duration::from_secs(10);

/// How often a condition is looked at again.
pub(crate) const POLL: Duration = Duration::from_millis(20);

/// A redis-server in a temporary directory, without persistence, killed when dropped.
pub(crate) struct Redis {
    child: Child,
    dir: PathBuf,
    /// `redis://127.0.0.1:PORT`.
    pub(crate) url: String,
}

impl Redis {
    /// Starts one on a free port and waits until it answers PING.
    pub(crate) fn start() -> Redis {
        let port = TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port();
        let dir = std::env::temp_dir().join(format!("braid-cluster-test-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&dir)
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server on PATH (scripts/install-test-deps)");
        let mut redis = Redis { child, dir, url: format!("redis://127.0.0.1:{port}") };
        let deadline = Instant::now() + WAIT;
        while !pong(port) {
            if let Ok(Some(status)) = redis.child.try_wait() {
                panic!("redis-server on port {port} exited: {status}");
            }
            assert!(Instant::now() < deadline, "redis-server on port {port} does not answer");
            std::thread::sleep(POLL);
        }
        redis
    }

    /// A connection to look inside.
    pub(crate) async fn conn(&self) -> Inspect {
        let client = redis::Client::open(self.url.as_str()).expect("a Redis URL");
        Inspect(client.get_multiplexed_async_connection().await.expect("connect to redis-server"))
    }
}

/// True if a redis-server on `port` answers PING.
fn pong(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else { return false };
    let mut reply = [0; 7];
    s.write_all(b"PING\r\n").is_ok() && s.read_exact(&mut reply).is_ok() && &reply == b"+PONG\r\n"
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A connection to the test's Redis, to read what the nodes keep there.
#[derive(Clone)]
pub(crate) struct Inspect(MultiplexedConnection);

impl Inspect {
    /// Runs `cmd`.
    pub(crate) async fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> T {
        cmd.query_async(&mut self.0.clone()).await.unwrap_or_else(|e| panic!("{cmd:?}: {e}"))
    }

    /// The owner and epoch of `client_id`'s session.
    pub(crate) async fn ownership(&self, client_id: &str) -> (Option<String>, Option<u64>) {
        self.query(redis::cmd("HMGET").arg(format!("braid:s:{{{client_id}}}")).arg("owner").arg("epoch"))
            .await
    }

    /// The client ids whose sessions Redis says `node` holds.
    pub(crate) async fn owned(&self, node: &str) -> Vec<String> {
        self.query(redis::cmd("SMEMBERS").arg(format!("braid:owned:{{{node}}}"))).await
    }
}

/// Polls `$holds` (an expression, awaiting as it likes) until it is true, failing the test
/// with `$what` after [`WAIT`].
macro_rules! eventually {
    ($what:expr, $holds:expr) => {{
        let deadline = std::time::Instant::now() + $crate::common::WAIT;
        while !$holds {
            assert!(std::time::Instant::now() < deadline, "timed out waiting until {}", $what);
            tokio::time::sleep($crate::common::POLL).await;
        }
    }};
}

/// A cluster node: a broker joined to the test's Redis (Redis only, no links), running on a
/// runtime of its own until dropped or killed.
pub(crate) struct TestNode {
    /// Its `cluster.node`.
    pub(crate) name: String,
    /// Its MQTT/TCP listener.
    pub(crate) addr: SocketAddr,
    /// Its broker.
    pub(crate) broker: Arc<Broker>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl TestNode {
    /// Starts node `name` with `cluster.lease_ms` = `lease_ms` and waits until its first
    /// heartbeat has listed it among the nodes.
    pub(crate) async fn start(redis: &Redis, name: &str, lease_ms: u64) -> TestNode {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime for the node");
        let mut config = Config::embedded();
        config.cluster = ClusterConfig {
            enabled: true,
            node: name.into(),
            redis: vec![redis.url.clone()],
            lease_ms,
            listen: String::new(),
            ..ClusterConfig::default()
        };
        let (addr, broker) = runtime
            .spawn(async move {
                let node = Node::connect(&config.cluster).await.expect("join the cluster's Redis");
                let (store, clock) = (node.store(), node.clock());
                let server = Server::bind_on(config, store, clock).await.expect("bind the node's listener");
                let (addr, broker) = (server.local_addr(), server.broker().clone());
                node.start(&broker).await.expect("start the node");
                tokio::spawn(server.run());
                (addr, broker)
            })
            .await
            .expect("the node started");
        let inspect = redis.conn().await;
        eventually!(
            "the node is listed",
            inspect.query::<bool>(redis::cmd("HEXISTS").arg("braid:nodes").arg(name)).await
        );
        TestNode { name: name.into(), addr, broker, runtime: Some(runtime) }
    }

    /// Stops the node at once, as a crash would: its tasks are dropped where they are, nothing
    /// more is written to Redis, and its lease is left to lapse.
    pub(crate) fn kill(self) {}

    /// The value of this node's metric `name`.
    pub(crate) fn metric(&self, name: &str) -> f64 {
        let mut samples: Vec<Sample> = Vec::new();
        for report in self.broker.operators().reports() {
            report.samples(&mut samples);
        }
        samples.iter().find(|s| s.name == name).unwrap_or_else(|| panic!("no metric {name}")).value
    }
}

impl Drop for TestNode {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
        // Ends the listener's accept thread, which is not a task of the runtime.
        self.broker.shutdown().cancel();
    }
}

/// A v5 client of `node` with a persistent session (an hour), resuming it if there is one.
pub(crate) async fn connect(node: &TestNode, client_id: &str) -> (Client, bool) {
    let mut opts = ClientOptions::new("127.0.0.1", node.addr.port());
    opts.client_id = client_id.into();
    opts.clean_start = false;
    opts.session_expiry = Some(3600);
    let (client, connected) = tokio::time::timeout(WAIT, Client::connect(opts))
        .await
        .unwrap_or_else(|_| panic!("{client_id} at {}: CONNECT timed out", node.name))
        .unwrap_or_else(|e| panic!("{client_id} at {}: CONNECT failed: {e}", node.name));
    (client, connected.session_present)
}

/// The next event of `client`: a message, or how its connection ended (None: the client is
/// closed).
pub(crate) async fn next_event(client: &Client) -> Option<Event> {
    tokio::time::timeout(WAIT, client.recv()).await.expect("an event from the broker")
}

/// The next message `client` receives.
pub(crate) async fn next_message(client: &Client) -> Publish {
    match next_event(client).await {
        Some(Event::Message(p)) => p,
        other => panic!("expected a message, got {other:?}"),
    }
}

/// How `client`'s connection ends: the reason of the broker's DISCONNECT.
pub(crate) async fn disconnect_reason(client: &Client) -> Option<ReasonCode> {
    match next_event(client).await {
        Some(Event::Disconnected(reason)) => reason,
        other => panic!("expected the connection to end, got {other:?}"),
    }
}

/// Subscribes `client` to `filter` at QoS 1.
pub(crate) async fn subscribe(client: &Client, filter: &str) {
    let options = SubscriptionOptions { qos: QoS::AtLeastOnce, ..SubscriptionOptions::default() };
    let granted =
        tokio::time::timeout(WAIT, client.subscribe(vec![(filter.into(), options)], Properties::default()))
            .await
            .expect("SUBACK in time")
            .expect("SUBACK");
    assert_eq!(granted, [ReasonCode::GrantedQoS1], "SUBSCRIBE {filter}");
}

/// Publishes `payload` to `topic` at QoS 1 and waits for its PUBACK, which says a subscriber
/// has it (here or in another node's inbox).
pub(crate) async fn publish(client: &Client, topic: &str, payload: &'static str) {
    let acked = async { client.publish(Message::new(topic, payload, QoS::AtLeastOnce)).await?.await };
    let reason = tokio::time::timeout(WAIT, acked).await.expect("PUBACK in time").expect("PUBACK");
    assert_eq!(reason, ReasonCode::Success, "PUBLISH {topic}");
}
