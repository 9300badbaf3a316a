//! `braid bench conn|sub|pub`: the load generator, flag-compatible with emqtt_bench where that
//! makes sense. Clients go through `braid-client`, so the tool measures any broker over any
//! transport the same way, except `conn` over plain TCP, whose clients are lean raw sockets
//! ([`lean`]) so that one process holds as many as it has file descriptors. See `bench/README.md`.

pub(crate) mod args;
pub(crate) mod conn;
pub(crate) mod lean;
pub(crate) mod payload;
pub(crate) mod r#pub;
pub(crate) mod report;
pub(crate) mod spec;
pub(crate) mod stats;
pub(crate) mod sub;

use std::process::ExitCode;

pub(crate) use args::BenchArgs;
use args::BenchCommand;

/// Runs `braid bench ...`.
pub(crate) fn run(args: BenchArgs) -> ExitCode {
    let (threads, json) = match args.command.as_ref() {
        BenchCommand::Conn(a) => (a.common.threads, a.common.json),
        BenchCommand::Sub(a) => (a.common.threads, a.common.json),
        BenchCommand::Pub(a) => (a.common.threads, a.common.json),
    };
    let runtime = match conn::runtime(threads) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("braid bench: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        match *args.command {
            BenchCommand::Conn(a)
                if a.full_client
                    || !matches!(a.common.transport.transport(), braid_client::Transport::Tcp) =>
            {
                if !a.topics.is_empty()
                    || a.interval_of_msg > 0
                    || !a.ifaddr.is_empty()
                    || a.storm_after.is_some()
                {
                    return Err(
                        "-t, -I, --ifaddr and --storm-after need plain TCP without --full-client".into()
                    );
                }
                Ok(conn::run(a).await)
            }
            BenchCommand::Conn(a) => lean::run(a).await,
            BenchCommand::Sub(a) => sub::run(a).await,
            BenchCommand::Pub(a) => r#pub::run(a).await,
        }
    });
    // Leave stragglers (tasks of clients that never answered) behind.
    runtime.shutdown_background();
    match result {
        Ok(summary) => {
            conn::print_summary(&summary, json);
            if summary.connect_succ == 0 {
                eprintln!("braid bench: no client could connect");
                return ExitCode::FAILURE;
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("braid bench: {e}");
            ExitCode::from(2)
        }
    }
}
