//! `braid`: the MQTT broker (`serve`), and later the client and benchmark tools.

/// jemalloc: size classes keep long-lived session state apart from per-connection buffers, so
/// memory freed by idle connections goes back to the OS (defaults in .cargo/config.toml).
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

// The runtime is built without tokio's LIFO slot, so that packets that arrive together are
// served in the order they arrived (docs/architecture.md "Threads"); `disable_lifo_slot` is
// behind tokio's `--cfg tokio_unstable`. A build without it would lose that order silently.
#[cfg(not(tokio_unstable))]
compile_error!(
    "braid needs `--cfg tokio_unstable` (tokio's Builder::disable_lifo_slot keeps packets that arrive \
     together in arrival order; docs/architecture.md \"Threads\"). The repository's \
     .cargo/config.toml passes it to cargo run in the repository; a RUSTFLAGS environment \
     variable replaces that list: add the flag to it (RUSTFLAGS=\"$RUSTFLAGS --cfg tokio_unstable\") \
     or unset it, and run cargo (build, run, install --path crates/braid) inside the repository."
);

use std::net::ToSocketAddrs;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::EnvFilter;

use braid_broker::rule_book::RuleBook;
use braid_broker::{Config, Server};

mod bench;
mod cli;
mod reload;
mod transport_args;

#[derive(Parser)]
#[command(name = "braid", version, about = "Braid: an MQTT 3.1, 3.1.1 and 5.0 broker")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the broker (no config needed: embedded defaults, MQTT on 0.0.0.0:1883).
    Serve(ServeArgs),
    /// Load generator, emqtt_bench-compatible flags: `braid bench conn|sub|pub --help`.
    Bench(bench::BenchArgs),
    /// Publish messages, mosquitto_pub flags: `braid pub -t topic -m message`.
    Pub(cli::publish::PubArgs),
    /// Subscribe and print messages, mosquitto_sub flags: `braid sub -t 'topic/#' -v`.
    Sub(cli::subscribe::SubArgs),
    /// Add, change or delete (-D) a user in a password file: `braid passwd FILE USER`.
    Passwd(cli::passwd::PasswdArgs),
    /// Add, list or delete keys of the HTTP admin API: `braid apikey add FILE NAME`.
    Apikey(cli::apikey::ApiKeyArgs),
    /// Operate a running broker through its HTTP admin API: `braid ctl clients|kick|...`.
    Ctl(cli::ctl::CtlArgs),
}

#[derive(clap::Args)]
struct ServeArgs {
    /// TOML configuration file (see docs/configuration.md).
    #[arg(short, long, env = "BRAID_CONFIG")]
    config: Option<PathBuf>,
    /// MQTT/TCP listen address: sets listeners.tcp (over the file and the environment; not
    /// together with --set listeners.tcp=...).
    #[arg(long, value_name = "HOST:PORT")]
    listen: Option<String>,
    /// Override one key: --set mqtt.max_inflight=100 (repeatable; value in TOML syntax).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => serve(args),
        Command::Bench(args) => bench::run(args),
        Command::Pub(args) => cli::publish::run(args),
        Command::Sub(args) => cli::subscribe::run(args),
        Command::Passwd(args) => cli::passwd::run(args),
        Command::Apikey(args) => cli::apikey::run(args),
        Command::Ctl(args) => cli::ctl::run(args),
    }
}

fn serve(args: ServeArgs) -> ExitCode {
    let mut overrides = args.set;
    if let Some(listen) = args.listen {
        // Both flags set listeners.tcp: refused, rather than one silently hiding the other (and
        // a bad value in it).
        let is_tcp =
            |item: &&String| item.split_once('=').is_some_and(|(key, _)| key.trim() == "listeners.tcp");
        if let Some(set) = overrides.iter().find(is_tcp) {
            eprintln!(
                "braid: invalid configuration: --listen {listen} and --set {set} both set listeners.tcp: give one"
            );
            return ExitCode::from(2);
        }
        // Host names are resolved here; the config file takes numeric addresses.
        match listen.to_socket_addrs().map(|mut a| a.next()) {
            Ok(Some(addr)) => overrides.push(format!("listeners.tcp=\"{addr}\"")),
            _ => {
                eprintln!("braid: invalid configuration: --listen {listen:?}: not a HOST:PORT address");
                return ExitCode::from(2);
            }
        }
    }
    let file = args.config;
    let config = match Config::load(file.as_deref(), &overrides) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("braid: invalid configuration: {e}");
            return ExitCode::from(2);
        }
    };
    if let Err(e) = braid_bridge::check(&config) {
        eprintln!("braid: invalid configuration: {e}");
        return ExitCode::from(2);
    }
    let from_env = std::env::var("BRAID_LOG").ok();
    let filter = match &from_env {
        Some(level) => EnvFilter::try_new(level).map_err(|e| format!("BRAID_LOG: {e}")),
        None => EnvFilter::try_new(&config.log.level).map_err(|e| format!("log.level: {e}")),
    };
    let filter = match filter {
        Ok(f) => f,
        Err(e) => {
            eprintln!("braid: invalid configuration: {e}");
            return ExitCode::from(2);
        }
    };
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    // The filter sits behind a reload handle: `log.level` changes on SIGHUP (unless BRAID_LOG
    // sets it).
    let (filter, log_handle) = tracing_subscriber::reload::Layer::new(filter);
    tracing_subscriber::registry()
        .with(filter)
        .with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_ansi(ansi))
        .init();
    let log_handle = from_env.is_none().then_some(log_handle);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let workers = config.runtime.workers(cores);
    // Without the LIFO slot, a worker runs tasks in the order they were woken: of two clients
    // whose packets one wake-up of the I/O driver found, the one whose bytes arrived first is
    // served first (with the slot, the task woken last ran first: a PUBLISH sent 0.1 ms after
    // another client's SUBSCRIBE to its topic was routed before it, and lost).
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.worker_threads(workers).enable_all();
    // An unstable tokio API: `--cfg tokio_unstable` (.cargo/config.toml), without which the
    // build stops at the `compile_error!` at the top of this file (the cfg here only keeps a
    // second error, "no method named `disable_lifo_slot`", from burying that one).
    #[cfg(tokio_unstable)]
    builder.disable_lifo_slot();
    let runtime = match builder.build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("braid: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    tracing::info!(workers, cores, "worker threads (runtime.worker_threads)");
    runtime.block_on(async move {
        let node = match config.cluster.enabled {
            false => None,
            true => match braid_cluster::Node::connect(&config.cluster).await {
                Ok(node) => Some(node),
                Err(e) => {
                    eprintln!("braid: cannot join the cluster: {e}; refusing to start");
                    return ExitCode::from(2);
                }
            },
        };
        let bound = match &node {
            Some(node) => Server::bind_on(config, node.store(), node.clock()).await,
            None => Server::bind(config).await,
        };
        let server = match bound {
            Ok(s) => s,
            Err(e) => return refused_start(e),
        };
        let member = match node {
            Some(node) => match node.start(server.broker()).await {
                Ok(member) => Some(member),
                Err(e) => {
                    eprintln!("braid: cannot join the cluster: {e}; refusing to start");
                    return ExitCode::FAILURE;
                }
            },
            None => None,
        };
        // The rules and sinks the API made before are in force before the sinks start.
        let book = match RuleBook::open(server.broker().clone()) {
            Ok(book) => book,
            Err(e) => {
                eprintln!("braid: invalid configuration: {e}");
                return ExitCode::from(2);
            }
        };
        let bridges = braid_bridge::start(server.broker()).await;
        let reloader = reload::Reloader::new(
            file,
            overrides,
            server.broker().clone(),
            book.clone(),
            log_handle,
            bridges,
        );
        let admin =
            braid_admin::AdminListener::bind(server.broker(), book, server.bound(), Some(reloader.reports()));
        let admin = match admin.await {
            Ok(admin) => admin,
            Err(e) => return refused_start(e),
        };
        if let Some(admin) = admin {
            tokio::spawn(admin.run());
        }
        tokio::spawn(reloader.run());
        let shutdown = server.broker().shutdown().clone();
        tokio::spawn(async move {
            wait_for_signal().await;
            shutdown.cancel();
        });
        server.run().await;
        if let Some(member) = member {
            member.leave().await;
        }
        ExitCode::SUCCESS
    })
}

/// The exit for a listener that did not open: status 2 for a configuration error (unusable
/// TLS or key files: `InvalidInput`), 1 for anything else (a port in use).
fn refused_start(e: std::io::Error) -> ExitCode {
    if e.kind() == std::io::ErrorKind::InvalidInput {
        eprintln!("braid: invalid configuration: {e}");
        return ExitCode::from(2);
    }
    eprintln!("braid: {e}");
    ExitCode::FAILURE
}

/// Resolves on SIGINT or SIGTERM.
async fn wait_for_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("installing a SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
