//! Reading Redis streams: the last entry's id, entries after a position, and the entries of
//! XREAD, XREADGROUP and XAUTOCLAIM replies.

use redis::Value;

use crate::redis::{bytes, Conn};

/// A stream entry id as numbers, to compare.
pub(crate) fn position(id: &str) -> (u64, u64) {
    let (ms, seq) = id.split_once('-').unwrap_or((id, "0"));
    (ms.parse().unwrap_or(0), seq.parse().unwrap_or(0))
}

/// The id of the last entry of `stream` ("0" if empty).
pub(crate) async fn last_id(conn: &mut Conn, stream: &str) -> redis::RedisResult<String> {
    let v: Value =
        redis::cmd("XREVRANGE").arg(stream).arg("+").arg("-").arg("COUNT").arg(1).query_async(conn).await?;
    Ok(match v {
        Value::Array(entries) => entries
            .first()
            .and_then(|e| match e {
                Value::Array(parts) => {
                    parts.first().and_then(bytes).map(|b| String::from_utf8_lossy(b).into_owned())
                }
                _ => None,
            })
            .unwrap_or_else(|| "0".into()),
        _ => "0".into(),
    })
}

/// Entries of `stream` after `from`, waiting up to a second for some.
pub(crate) async fn read_log(
    conn: &mut Conn,
    stream: &str,
    from: &str,
) -> redis::RedisResult<Vec<(String, Vec<Value>)>> {
    let v: Value = redis::cmd("XREAD")
        .arg("COUNT")
        .arg(1000)
        .arg("BLOCK")
        .arg(1000)
        .arg("STREAMS")
        .arg(stream)
        .arg(from)
        .query_async(conn)
        .await?;
    Ok(stream_entries(v))
}

/// The (id, fields) entries of an XREAD / XREADGROUP reply for one stream, taken out of it.
pub(crate) fn stream_entries(v: Value) -> Vec<(String, Vec<Value>)> {
    let streams: Vec<Value> = match v {
        Value::Array(s) => s,
        Value::Map(m) => m.into_iter().map(|(_, v)| v).collect(),
        _ => return Vec::new(),
    };
    let mut out = Vec::new();
    for s in streams {
        let entries = match s {
            Value::Array(mut parts) if parts.len() == 2 && matches!(parts[1], Value::Array(_)) => {
                parts.swap_remove(1)
            }
            other => other,
        };
        out.extend(entries_of(entries));
    }
    out
}

/// The (id, fields) entries of a list of stream entries, taken out of it (entries deleted
/// meanwhile, whose fields are nil, left out).
pub(crate) fn entries_of(list: Value) -> Vec<(String, Vec<Value>)> {
    let Value::Array(entries) = list else { return Vec::new() };
    entries
        .into_iter()
        .filter_map(|e| {
            let Value::Array(parts) = e else { return None };
            let mut parts = parts.into_iter();
            let id = String::from_utf8_lossy(bytes(&parts.next()?)?).into_owned();
            let Some(Value::Array(fields)) = parts.next() else { return None };
            Some((id, fields))
        })
        .collect()
}
