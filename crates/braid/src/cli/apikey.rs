//! `braid apikey`: manages the API keys file of the HTTP admin listener
//! (`admin.api_keys_file`): adds a key (printed once), lists the names, deletes one. The
//! broker reads the file at start. Format: `docs/api.md`.

use std::path::PathBuf;
use std::process::ExitCode;

use braid_admin::keys::ApiKeys;

/// `braid apikey add|list|delete FILE [NAME]`.
#[derive(clap::Args, Debug)]
pub(crate) struct ApiKeyArgs {
    #[command(subcommand)]
    command: ApiKeyCommand,
}

#[derive(clap::Subcommand, Debug)]
enum ApiKeyCommand {
    /// Make a key named NAME (replacing one of that name) and print it: the only time it is
    /// shown. The file is created if missing (mode 0600).
    Add {
        /// The API keys file.
        file: PathBuf,
        /// The key's name (letters, digits, '-', '_', '.'): the user of basic auth.
        name: String,
    },
    /// List the keys' names.
    List {
        /// The API keys file.
        file: PathBuf,
    },
    /// Delete NAME's key.
    Delete {
        /// The API keys file.
        file: PathBuf,
        /// The key's name.
        name: String,
    },
}

/// Runs `braid apikey`: exit status 0, or 1 with a message on stderr.
pub(crate) fn run(args: ApiKeyArgs) -> ExitCode {
    match apikey(args.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("braid apikey: {e}");
            ExitCode::from(1)
        }
    }
}

fn apikey(command: ApiKeyCommand) -> Result<(), String> {
    match command {
        ApiKeyCommand::Add { file, name } => {
            let mut keys = ApiKeys::load_or_empty(&file).map_err(|e| e.to_string())?;
            let key = keys.add(&name)?;
            keys.save(&file).map_err(|e| format!("{}: {e}", file.display()))?;
            println!("{key}");
            eprintln!("added key {name:?} to {} (shown only now; a running broker loads it on reload: SIGHUP or `braid ctl reload`)", file.display());
        }
        ApiKeyCommand::List { file } => {
            for name in ApiKeys::load(&file).map_err(|e| e.to_string())?.names() {
                println!("{name}");
            }
        }
        ApiKeyCommand::Delete { file, name } => {
            let mut keys = ApiKeys::load(&file).map_err(|e| e.to_string())?;
            if !keys.remove(&name) {
                return Err(format!("no key named {name:?} in {}", file.display()));
            }
            keys.save(&file).map_err(|e| format!("{}: {e}", file.display()))?;
            eprintln!("deleted key {name:?}");
        }
    }
    Ok(())
}
