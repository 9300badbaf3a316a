//! `braid bench conn|sub|pub`: the load generator, flag-compatible with emqtt_bench where that
//! makes sense. Every client goes through `braid-client`, so the tool measures any broker (and,
//! later, any transport) the same way. See `bench/README.md`.

pub(crate) mod args;
pub(crate) mod conn;
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
            BenchCommand::Conn(a) => Ok(conn::run(a).await),
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
