//! `braid passwd`: manages the password file the broker reads (`auth.password_file`): adds a
//! user or changes a password (Argon2id, fresh salt), or deletes a user. The broker picks the
//! change up without a restart. Format: `docs/security.md`.

use std::io::BufRead;
use std::path::PathBuf;
use std::process::ExitCode;

use braid_broker::auth::password::PasswordFile;

/// `braid passwd [-D] [--password PW] FILE USER`.
#[derive(clap::Args, Debug)]
pub(crate) struct PasswdArgs {
    /// Delete USER instead of setting a password.
    #[arg(short = 'D', long = "delete")]
    pub delete: bool,
    /// The password (otherwise prompted for, twice, or read as one line from a non-terminal
    /// stdin). Beware: visible in the process list and shell history.
    #[arg(long, conflicts_with = "delete")]
    pub password: Option<String>,
    /// The password file; created if missing (-D needs it to exist).
    pub file: PathBuf,
    /// The user name.
    pub user: String,
}

/// Runs `braid passwd`: exit status 0, or 1 with a message on stderr.
pub(crate) fn run(args: PasswdArgs) -> ExitCode {
    match passwd(args) {
        Ok(msg) => {
            eprintln!("{msg}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("braid passwd: {e}");
            ExitCode::from(1)
        }
    }
}

fn passwd(args: PasswdArgs) -> Result<String, String> {
    let path = &args.file;
    if args.delete && !path.exists() {
        return Err(format!("{}: no such file", path.display()));
    }
    let mut file = if path.exists() {
        PasswordFile::load(path).map_err(|e| e.to_string())?
    } else {
        PasswordFile::default()
    };
    let msg = if args.delete {
        if !file.remove(&args.user) {
            return Err(format!("user {:?} is not in {}", args.user, path.display()));
        }
        format!("deleted user {:?}", args.user)
    } else {
        let password = match args.password {
            Some(p) => p,
            None => read_password()?,
        };
        if password.is_empty() {
            return Err("empty password".into());
        }
        let existed = file.contains(&args.user);
        file.set(&args.user, password.as_bytes())?;
        format!("{} user {:?}", if existed { "changed password of" } else { "added" }, args.user)
    };
    file.save(path).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    Ok(format!("{msg} in {}", path.display()))
}

/// Prompts twice on a terminal; otherwise reads one line from stdin.
fn read_password() -> Result<String, String> {
    if std::io::IsTerminal::is_terminal(&std::io::stdin()) {
        let first = rpassword::prompt_password("Password: ").map_err(|e| e.to_string())?;
        let again = rpassword::prompt_password("Again: ").map_err(|e| e.to_string())?;
        if first != again {
            return Err("the passwords differ".into());
        }
        Ok(first)
    } else {
        let mut line = String::new();
        std::io::stdin().lock().read_line(&mut line).map_err(|e| e.to_string())?;
        Ok(line.trim_end_matches(['\r', '\n']).to_string())
    }
}
