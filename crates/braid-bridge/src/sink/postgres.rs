//! The `postgres` sink (PostgreSQL, TimescaleDB): the `sql` template's placeholders become the
//! statement's parameters (`$1`, `$2`...), never text spliced into the SQL; the statement is
//! prepared once per connection, and a batch's rows are sent pipelined on one connection, each
//! in its own transaction, so that a row the database refuses (a violated constraint, a value
//! of the wrong type: counted, not written again) does not take the others with it. A lost
//! connection, or an error that is the database's state rather than the row's, writes the row
//! again on a new connection.
//!
//! A parameter's value is converted to the type PostgreSQL infers for it: numbers to integer
//! and float columns, strings to text, JSON values to `json`/`jsonb`, a number of milliseconds
//! since the Unix epoch to `timestamp(tz)`; for another type, cast in the SQL from text
//! (`${amount}::text::numeric`).

use std::error::Error as _;
use std::time::{Duration, UNIX_EPOCH};

use braid_broker::config::SinkConfig;
use braid_rules::{Field, Template};
use bytes::BytesMut;
use futures_util::future::join_all;
use serde_json::Value;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{IsNull, ToSql, Type};
use tokio_postgres::{Client, NoTls, Statement};
use tracing::warn;

use super::{Output, Written};

/// A PostgreSQL target.
pub(super) struct Postgres {
    url: String,
    /// The statement with `$n` for each placeholder.
    sql: String,
    params: Vec<Field>,
    connection: Option<(Client, Statement)>,
}

impl Postgres {
    pub(super) fn new(config: &SinkConfig) -> Result<Postgres, String> {
        let template = Template::parse(&config.sql).map_err(|e| format!("sql: {e}"))?;
        let (sql, params) = template.parameters(|n| format!("${n}"));
        config.url.parse::<tokio_postgres::Config>().map_err(|e| format!("url: {e}"))?;
        Ok(Postgres { url: config.url.clone(), sql, params, connection: None })
    }

    /// The connection and the prepared statement, opened if there is none (or it closed).
    async fn connection(&mut self) -> Result<&(Client, Statement), Written> {
        if self.connection.as_ref().is_some_and(|(c, _)| c.is_closed()) {
            self.connection = None;
        }
        if self.connection.is_none() {
            let (client, connection) =
                tokio_postgres::connect(&self.url, NoTls).await.map_err(|e| failure(&e))?;
            tokio::spawn(async move {
                if let Err(e) = connection.await {
                    warn!("sink: PostgreSQL connection: {e}");
                }
            });
            let statement = client.prepare(&self.sql).await.map_err(|e| failure(&e))?;
            self.connection = Some((client, statement));
        }
        Ok(self.connection.as_ref().expect("opened above"))
    }

    pub(super) async fn write(&mut self, batch: &[&Output]) -> Vec<Written> {
        let params = self.params.clone();
        let (client, statement) = match self.connection().await {
            Ok(c) => c,
            Err(w) => return batch.iter().map(|_| w.clone()).collect(),
        };
        let rows = batch.iter().map(|output| {
            let values: Vec<Param> =
                params.iter().map(|f| Param(f.value(output).map(|v| v.into_owned()))).collect();
            async move {
                let refs: Vec<&(dyn ToSql + Sync)> =
                    values.iter().map(|v| v as &(dyn ToSql + Sync)).collect();
                match client.execute(statement, &refs).await {
                    Ok(_) => Written::Sent,
                    Err(e) => failure(&e),
                }
            }
        });
        let written = join_all(rows).await;
        if written.iter().any(|w| matches!(w, Written::Failed(_))) {
            self.connection = None;
        }
        written
    }
}

/// What a PostgreSQL error means for a row: the row's own fault (a violated constraint, a bad
/// value, a statement that cannot work on it) is a refusal; anything else is written again.
fn failure(e: &tokio_postgres::Error) -> Written {
    let text = match e.as_db_error() {
        Some(db) => format!("{}: {}", db.code().code(), db.message()),
        None => match e.source() {
            Some(source) => format!("{e}: {source}"),
            None => e.to_string(),
        },
    };
    let row_fault = match e.code() {
        Some(code) => {
            let class = &code.code()[..2];
            // 22 data exception, 23 integrity constraint, 42 syntax or access rule.
            ["22", "23", "42"].contains(&class) && *code != SqlState::INSUFFICIENT_PRIVILEGE
        }
        // A value that does not convert to its parameter's type.
        None => e.source().is_some_and(|s| s.is::<WrongType>()),
    };
    if row_fault {
        Written::Refused(text)
    } else {
        Written::Failed(text)
    }
}

/// A parameter: an output value (None: missing or null, written as NULL), converted to the
/// type PostgreSQL inferred for it.
#[derive(Debug)]
struct Param(Option<Value>);

/// A value that does not convert to its parameter's type.
#[derive(Debug)]
struct WrongType(String);

impl std::fmt::Display for WrongType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for WrongType {}

type BoxError = Box<dyn std::error::Error + Sync + Send>;

impl ToSql for Param {
    fn to_sql(&self, ty: &Type, out: &mut BytesMut) -> Result<IsNull, BoxError> {
        let value = match &self.0 {
            None | Some(Value::Null) => return Ok(IsNull::Yes),
            Some(v) => v,
        };
        let wrong = || -> BoxError { Box::new(WrongType(format!("{value} is not a value of type {ty}"))) };
        let number = || match value {
            Value::Number(n) => n.as_f64(),
            Value::String(s) => s.trim().parse().ok(),
            _ => None,
        };
        let integer = || match value {
            Value::Number(n) => n.as_i64(),
            Value::String(s) => s.trim().parse().ok(),
            _ => None,
        };
        match *ty {
            Type::BOOL => match value {
                Value::Bool(b) => b.to_sql(ty, out),
                Value::String(s) if s == "true" || s == "false" => (s == "true").to_sql(ty, out),
                _ => Err(wrong()),
            },
            Type::INT2 => i16::try_from(integer().ok_or_else(wrong)?).map_err(|_| wrong())?.to_sql(ty, out),
            Type::INT4 => i32::try_from(integer().ok_or_else(wrong)?).map_err(|_| wrong())?.to_sql(ty, out),
            Type::INT8 => integer().ok_or_else(wrong)?.to_sql(ty, out),
            Type::FLOAT4 => (number().ok_or_else(wrong)? as f32).to_sql(ty, out),
            Type::FLOAT8 => number().ok_or_else(wrong)?.to_sql(ty, out),
            Type::JSON | Type::JSONB => value.to_sql(ty, out),
            Type::TIMESTAMP | Type::TIMESTAMPTZ => {
                let ms = u64::try_from(integer().ok_or_else(wrong)?).map_err(|_| wrong())?;
                (UNIX_EPOCH + Duration::from_millis(ms)).to_sql(ty, out)
            }
            Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME | Type::UNKNOWN => match value {
                Value::String(s) => s.as_str().to_sql(ty, out),
                other => other.to_string().as_str().to_sql(&Type::TEXT, out),
            },
            _ => Err(Box::new(WrongType(format!(
                "parameter of type {ty}: cast it in the SQL from text, e.g. ${{x}}::text::{ty}"
            )))),
        }
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    tokio_postgres::types::to_sql_checked!();
}
