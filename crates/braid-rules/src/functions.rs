//! The functions a rule may call, EMQX's names and argument orders. A null argument gives null,
//! and so does an argument of the wrong kind: a function never fails on the publish path.

use std::fmt::Write as _;

use base64::Engine as _;
use md5::Md5;
use regex::Regex;
use serde_json::Value;
use sha1::Sha1;
use sha2::{Digest, Sha256};
use time::format_description::well_known::Rfc3339;
use time::{OffsetDateTime, UtcOffset};

use crate::compile::Expr;
use crate::value::{number, text, Num};

/// A function a rule may call: its name, how many arguments it takes (fewest, most), and how
/// its compiled form is built from the arguments (some take a literal out of them up front).
struct Signature {
    name: &'static str,
    args: (usize, usize),
    build: fn(&mut Vec<Expr>) -> Result<Func, String>,
}

/// A [`Signature`]: a builder closure, or a plain [`Func`] that takes its arguments' values.
macro_rules! sig {
    ($name:literal, $min:literal..=$max:literal, |$args:ident| $build:expr) => {
        Signature { name: $name, args: ($min, $max), build: |$args| $build }
    };
    ($name:literal, $min:literal..=$max:literal, $func:expr) => {
        Signature { name: $name, args: ($min, $max), build: |_| Ok($func) }
    };
}

/// Every function, as documented in docs/rules.md.
const FUNCTIONS: &[Signature] = &[
    sig!("lower", 1..=1, Func::Lower),
    sig!("upper", 1..=1, Func::Upper),
    sig!("trim", 1..=1, Func::Trim),
    sig!("ltrim", 1..=1, Func::Ltrim),
    sig!("rtrim", 1..=1, Func::Rtrim),
    sig!("concat", 2..=16, Func::Concat),
    sig!("substr", 2..=3, Func::Substr),
    sig!("split", 2..=2, Func::Split),
    sig!("tokens", 2..=2, Func::Tokens),
    sig!("nth", 2..=2, Func::Nth),
    sig!("replace", 3..=3, Func::Replace),
    sig!("regex_match", 2..=2, |args| Ok(Func::RegexMatch(regex(args.remove(1))?))),
    sig!("regex_replace", 3..=3, |args| Ok(Func::RegexReplace(regex(args.remove(1))?))),
    sig!("strlen", 1..=1, Func::Strlen),
    sig!("str", 1..=1, Func::Str),
    sig!("int", 1..=1, Func::Int),
    sig!("float", 1..=1, Func::Float),
    sig!("abs", 1..=1, Func::Abs),
    sig!("ceil", 1..=1, Func::Ceil),
    sig!("floor", 1..=1, Func::Floor),
    sig!("round", 1..=1, Func::Round),
    sig!("sqrt", 1..=1, Func::Sqrt),
    sig!("power", 2..=2, Func::Power),
    sig!("mod", 2..=2, Func::Mod),
    sig!("json_encode", 1..=1, Func::JsonEncode),
    sig!("json_decode", 1..=1, Func::JsonDecode),
    sig!("base64_encode", 1..=1, Func::Base64Encode),
    sig!("base64_decode", 1..=1, Func::Base64Decode),
    sig!("md5", 1..=1, Func::Md5),
    sig!("sha1", 1..=1, Func::Sha1),
    sig!("sha256", 1..=1, Func::Sha256),
    sig!("now_timestamp", 0..=1, |args| unit_arg(args, 0).map(|_| Func::NowTimestamp)),
    sig!("unix_ts_to_rfc3339", 1..=2, |args| unit_arg(args, 1).map(|_| Func::UnixTsToRfc3339)),
    sig!("rfc3339_to_unix_ts", 1..=2, |args| unit_arg(args, 1).map(|_| Func::Rfc3339ToUnixTs)),
    sig!("format_date", 3..=4, |args| DateFormat::build(args).map(|f| Func::FormatDate(Box::new(f)))),
];

/// A compiled function. Most take their arguments' values; the regex functions have their
/// pattern, and `format_date` its unit, offset and format, compiled in.
#[derive(Debug, Clone)]
pub(crate) enum Func {
    Lower,
    Upper,
    Trim,
    Ltrim,
    Rtrim,
    Concat,
    Substr,
    Split,
    Tokens,
    Nth,
    Replace,
    RegexMatch(Regex),
    RegexReplace(Regex),
    Strlen,
    Str,
    Int,
    Float,
    Abs,
    Ceil,
    Floor,
    Round,
    Sqrt,
    Power,
    Mod,
    JsonEncode,
    JsonDecode,
    Base64Encode,
    Base64Decode,
    Md5,
    Sha1,
    Sha256,
    NowTimestamp,
    UnixTsToRfc3339,
    Rfc3339ToUnixTs,
    FormatDate(Box<DateFormat>),
}

/// The function `name` (matched without regard to case) called with `args`. Literal arguments
/// it needs up front are taken out of `args`. The error says what is wrong: an unknown name (with
/// a near one if there is), a wrong number of arguments, a bad literal.
pub(crate) fn resolve(name: &str, args: &mut Vec<Expr>) -> Result<Func, String> {
    let name = name.to_ascii_lowercase();
    let Some(sig) = FUNCTIONS.iter().find(|s| s.name == name) else {
        let near = crate::compile::nearest(&name, FUNCTIONS.iter().map(|s| s.name));
        return Err(format!(
            "unknown function `{name}`{}",
            near.map(|n| format!("; did you mean {n}?")).unwrap_or_default()
        ));
    };
    let (min, max) = sig.args;
    if !(min..=max).contains(&args.len()) {
        let wanted = match (min, max) {
            (n, m) if n == m => format!("{n}"),
            (n, 16) => format!("at least {n}"),
            (n, m) => format!("{n} to {m}"),
        };
        let plural = if (min, max) == (1, 1) { "" } else { "s" };
        return Err(format!("function `{name}` takes {wanted} argument{plural}, got {}", args.len()));
    }
    (sig.build)(args).map_err(|e| format!("{name}: {e}"))
}

/// Names of all functions, for docs and tests.
#[cfg(test)]
pub(crate) fn names() -> impl Iterator<Item = &'static str> {
    FUNCTIONS.iter().map(|s| s.name)
}

/// The string literal at `arg`, or an error saying one is needed.
fn literal(arg: &Expr, what: &str) -> Result<String, String> {
    match arg {
        Expr::Literal(Value::String(s)) => Ok(s.clone()),
        _ => Err(format!("the {what} must be a string literal")),
    }
}

/// Compiles the regular expression literal `arg`.
fn regex(arg: Expr) -> Result<Regex, String> {
    Regex::new(&literal(&arg, "pattern")?).map_err(|e| {
        // The regex crate's message draws the pattern over several lines; its last line says why.
        let e = e.to_string();
        let why = e.lines().last().unwrap_or_default().trim_start_matches("error: ");
        format!("invalid regular expression: {why}")
    })
}

/// Checks the time unit at `args[i]` when it is a literal (a computed unit is checked per call).
fn unit_arg(args: &[Expr], i: usize) -> Result<(), String> {
    match args.get(i) {
        Some(Expr::Literal(unit)) => TimeUnit::of(unit).map(|_| ()),
        _ => Ok(()),
    }
}

impl Func {
    /// The function's result for the argument values `args`.
    pub(crate) fn call(&self, args: Vec<Value>) -> Value {
        self.try_call(args).unwrap_or(Value::Null)
    }

    fn try_call(&self, mut args: Vec<Value>) -> Option<Value> {
        let arg = |i: usize| args.get(i).and_then(text);
        let num = |i: usize| args.get(i).and_then(number);
        let string = |s: String| Some(Value::String(s));
        match self {
            Func::Lower => string(arg(0)?.to_lowercase()),
            Func::Upper => string(arg(0)?.to_uppercase()),
            Func::Trim => string(arg(0)?.trim().to_owned()),
            Func::Ltrim => string(arg(0)?.trim_start().to_owned()),
            Func::Rtrim => string(arg(0)?.trim_end().to_owned()),
            Func::Concat => string(args.iter().filter_map(text).collect()),
            Func::Substr => {
                let s = arg(0)?;
                let start = usize::try_from(num(1)?.float().max(0.0) as i64).ok()?;
                let len = match num(2) {
                    Some(n) => usize::try_from(n.float().max(0.0) as i64).ok()?,
                    None if args.len() > 2 => return None,
                    None => usize::MAX,
                };
                string(s.chars().skip(start).take(len).collect())
            }
            Func::Split => {
                let (s, sep) = (arg(0)?, arg(1)?);
                let parts = s.split(&*sep).filter(|p| !p.is_empty());
                Some(Value::Array(parts.map(|p| Value::String(p.to_owned())).collect()))
            }
            Func::Tokens => {
                let (s, seps) = (arg(0)?, arg(1)?);
                let parts = s.split(|c| seps.contains(c)).filter(|p| !p.is_empty());
                Some(Value::Array(parts.map(|p| Value::String(p.to_owned())).collect()))
            }
            Func::Nth => {
                let Num::Int(n) = num(0)? else { return None };
                match args.get_mut(1)? {
                    Value::Array(items) if n >= 1 => {
                        let i = usize::try_from(n - 1).ok()?;
                        (i < items.len()).then(|| items.swap_remove(i))
                    }
                    _ => None,
                }
            }
            Func::Replace => string(arg(0)?.replace(&*arg(1)?, &arg(2)?)),
            Func::RegexMatch(re) => Some(Value::Bool(re.is_match(&arg(0)?))),
            Func::RegexReplace(re) => string(re.replace_all(&arg(0)?, &*arg(1)?).into_owned()),
            Func::Strlen => Some(Value::from(arg(0)?.chars().count())),
            Func::Str => string(arg(0)?.into_owned()),
            Func::Int => match args.first()? {
                Value::Bool(b) => Some(Value::from(i64::from(*b))),
                _ => match num(0)? {
                    Num::Int(i) => Some(Value::from(i)),
                    Num::Float(f) => Some(Num::Int(f.trunc() as i64).value()),
                },
            },
            Func::Float => Some(Num::Float(num(0)?.float()).value()),
            Func::Abs => Some(
                match num(0)? {
                    Num::Int(i) => Num::Int(i.checked_abs()?),
                    Num::Float(f) => Num::Float(f.abs()),
                }
                .value(),
            ),
            Func::Ceil => Some(integral(num(0)?, f64::ceil)),
            Func::Floor => Some(integral(num(0)?, f64::floor)),
            Func::Round => Some(integral(num(0)?, f64::round)),
            Func::Sqrt => Some(Num::Float(num(0)?.float().sqrt()).value()),
            Func::Power => Some(Num::Float(num(0)?.float().powf(num(1)?.float())).value()),
            Func::Mod => Some(
                match (num(0)?, num(1)?) {
                    (Num::Int(a), Num::Int(b)) => Num::Int(a.checked_rem(b)?),
                    (a, b) if b.float() != 0.0 => Num::Float(a.float() % b.float()),
                    _ => return None,
                }
                .value(),
            ),
            Func::JsonEncode => string(args.first()?.to_string()),
            Func::JsonDecode => serde_json::from_str(&arg(0)?).ok(),
            Func::Base64Encode => {
                string(base64::engine::general_purpose::STANDARD.encode(arg(0)?.as_bytes()))
            }
            Func::Base64Decode => {
                let bytes = base64::engine::general_purpose::STANDARD.decode(arg(0)?.as_bytes()).ok()?;
                string(String::from_utf8_lossy(&bytes).into_owned())
            }
            Func::Md5 => string(hex::encode(Md5::digest(arg(0)?.as_bytes()))),
            Func::Sha1 => string(hex::encode(Sha1::digest(arg(0)?.as_bytes()))),
            Func::Sha256 => string(hex::encode(Sha256::digest(arg(0)?.as_bytes()))),
            Func::NowTimestamp => {
                let unit = unit_or_second(args.first())?;
                let now = OffsetDateTime::now_utc().unix_timestamp_nanos() / unit.nanos();
                Some(Value::from(i64::try_from(now).ok()?))
            }
            Func::UnixTsToRfc3339 => {
                let time = unit_or_second(args.get(1))?.to_time(num(0)?)?;
                string(time.format(&Rfc3339).ok()?)
            }
            Func::Rfc3339ToUnixTs => {
                let time = OffsetDateTime::parse(&arg(0)?, &Rfc3339).ok()?;
                let ts = time.unix_timestamp_nanos() / unit_or_second(args.get(1))?.nanos();
                Some(Value::from(i64::try_from(ts).ok()?))
            }
            Func::FormatDate(format) => string(format.format(args.first())?),
        }
    }
}

/// `n` rounded to an integer by `round` (an integer stays as it is).
fn integral(n: Num, round: fn(f64) -> f64) -> Value {
    match n {
        Num::Int(i) => Value::from(i),
        Num::Float(f) => {
            let r = round(f);
            // Within i64's range the result is an integer; beyond it, keep the float.
            if r.abs() < 9.2e18 {
                Value::from(r as i64)
            } else {
                Num::Float(r).value()
            }
        }
    }
}

/// The time unit in `arg`, `second` when there is none; `None` when it is not a unit.
fn unit_or_second(arg: Option<&Value>) -> Option<TimeUnit> {
    arg.map_or(Some(TimeUnit::Second), |v| TimeUnit::of(v).ok())
}

/// The unit of a Unix timestamp, as EMQX names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TimeUnit {
    Second,
    Millisecond,
    Microsecond,
    Nanosecond,
}

impl TimeUnit {
    /// The unit `value` names (`'second'`, `'millisecond'`, `'microsecond'`, `'nanosecond'`).
    fn of(value: &Value) -> Result<TimeUnit, String> {
        match value.as_str() {
            Some("second") => Ok(TimeUnit::Second),
            Some("millisecond") => Ok(TimeUnit::Millisecond),
            Some("microsecond") => Ok(TimeUnit::Microsecond),
            Some("nanosecond") => Ok(TimeUnit::Nanosecond),
            _ => Err(format!(
                "unknown time unit {value}; expected 'second', 'millisecond', 'microsecond' or 'nanosecond'"
            )),
        }
    }

    fn nanos(self) -> i128 {
        match self {
            TimeUnit::Second => 1_000_000_000,
            TimeUnit::Millisecond => 1_000_000,
            TimeUnit::Microsecond => 1_000,
            TimeUnit::Nanosecond => 1,
        }
    }

    /// The UTC time `ts` units after the Unix epoch.
    fn to_time(self, ts: Num) -> Option<OffsetDateTime> {
        let nanos = match ts {
            Num::Int(i) => i128::from(i) * self.nanos(),
            Num::Float(f) => (f * self.nanos() as f64) as i128,
        };
        OffsetDateTime::from_unix_timestamp_nanos(nanos).ok()
    }
}

/// `format_date(unit, offset, format[, timestamp])`, with the first three compiled in.
#[derive(Debug, Clone)]
pub(crate) struct DateFormat {
    unit: TimeUnit,
    offset: UtcOffset,
    parts: Vec<DatePart>,
}

/// A piece of a `format_date` format: text, or a `%` directive.
#[derive(Debug, Clone, PartialEq)]
enum DatePart {
    Text(String),
    /// `%Y`, `%m`, `%d`, `%H`, `%M`, `%S`.
    Year,
    Month,
    Day,
    Hour,
    Minute,
    Second,
    /// `%N` (9 digits) or `%3N`, `%6N`: the fraction of a second.
    Fraction(usize),
    /// `%z` (+hhmm), `%:z` (+hh:mm), `%::z` (+hh:mm:ss).
    Offset(usize),
}

impl DateFormat {
    /// Takes the unit, offset and format literals out of `format_date`'s arguments.
    fn build(args: &mut Vec<Expr>) -> Result<DateFormat, String> {
        let format: Vec<Expr> = args.drain(..3).collect();
        let unit = match &format[0] {
            Expr::Literal(v) => TimeUnit::of(v)?,
            _ => return Err("the unit must be a string literal".into()),
        };
        let offset = match &format[1] {
            Expr::Literal(Value::Number(n)) => n
                .as_i64()
                .and_then(|s| UtcOffset::from_whole_seconds(i32::try_from(s).ok()?).ok())
                .ok_or_else(|| format!("offset {n} is out of range"))?,
            other => parse_offset(&literal(other, "offset")?)?,
        };
        Ok(DateFormat { unit, offset, parts: parse_format(&literal(&format[2], "format")?)? })
    }

    /// The timestamp `ts` (now when absent) written in this format.
    fn format(&self, ts: Option<&Value>) -> Option<String> {
        let time = match ts {
            Some(v) => self.unit.to_time(number(v)?)?,
            None => OffsetDateTime::now_utc(),
        }
        .to_offset(self.offset);
        let mut out = String::new();
        for part in &self.parts {
            let _ = match part {
                DatePart::Text(s) => write!(out, "{s}"),
                DatePart::Year => write!(out, "{:04}", time.year()),
                DatePart::Month => write!(out, "{:02}", u8::from(time.month())),
                DatePart::Day => write!(out, "{:02}", time.day()),
                DatePart::Hour => write!(out, "{:02}", time.hour()),
                DatePart::Minute => write!(out, "{:02}", time.minute()),
                DatePart::Second => write!(out, "{:02}", time.second()),
                DatePart::Fraction(digits) => {
                    let nanos = format!("{:09}", time.nanosecond());
                    write!(out, "{}", &nanos[..*digits])
                }
                DatePart::Offset(colons) => {
                    let (h, m, s) = self.offset.as_hms();
                    let sign = if self.offset.is_negative() { '-' } else { '+' };
                    let (h, m, s) = (h.abs(), m.abs(), s.abs());
                    match colons {
                        0 => write!(out, "{sign}{h:02}{m:02}"),
                        1 => write!(out, "{sign}{h:02}:{m:02}"),
                        _ => write!(out, "{sign}{h:02}:{m:02}:{s:02}"),
                    }
                }
            };
        }
        Some(out)
    }
}

/// A UTC offset: `Z`, `+08:00`, `-0530`.
fn parse_offset(s: &str) -> Result<UtcOffset, String> {
    let bad = || format!("invalid offset '{s}'; expected 'Z' or one like '+08:00'");
    if s.eq_ignore_ascii_case("z") {
        return Ok(UtcOffset::UTC);
    }
    let (sign, rest) = match s.as_bytes().first() {
        Some(b'+') => (1, &s[1..]),
        Some(b'-') => (-1, &s[1..]),
        _ => return Err(bad()),
    };
    let digits: String = rest.chars().filter(|c| *c != ':').collect();
    if digits.len() != 4 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let (h, m): (i8, i8) = (digits[..2].parse().map_err(|_| bad())?, digits[2..].parse().map_err(|_| bad())?);
    UtcOffset::from_hms(sign * h, sign * m, 0).map_err(|_| bad())
}

/// The parts of a `format_date` format such as `%Y-%m-%d %H:%M:%S`.
fn parse_format(format: &str) -> Result<Vec<DatePart>, String> {
    let mut parts = Vec::new();
    let mut text = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            text.push(c);
            continue;
        }
        let mut directive = String::new();
        let part = loop {
            let Some(d) = chars.next() else {
                return Err(format!("format ends inside the directive `%{directive}`"));
            };
            directive.push(d);
            match directive.as_str() {
                "%" => break None,
                "Y" => break Some(DatePart::Year),
                "m" => break Some(DatePart::Month),
                "d" => break Some(DatePart::Day),
                "H" => break Some(DatePart::Hour),
                "M" => break Some(DatePart::Minute),
                "S" => break Some(DatePart::Second),
                "N" => break Some(DatePart::Fraction(9)),
                "3N" => break Some(DatePart::Fraction(3)),
                "6N" => break Some(DatePart::Fraction(6)),
                "z" => break Some(DatePart::Offset(0)),
                ":z" => break Some(DatePart::Offset(1)),
                "::z" => break Some(DatePart::Offset(2)),
                "3" | "6" | ":" | "::" => {}
                _ => return Err(format!("unknown directive `%{directive}` in the format")),
            }
        };
        match part {
            None => text.push('%'),
            Some(part) => {
                if !text.is_empty() {
                    parts.push(DatePart::Text(std::mem::take(&mut text)));
                }
                parts.push(part);
            }
        }
    }
    if !text.is_empty() {
        parts.push(DatePart::Text(text));
    }
    Ok(parts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Calls `name` with literal arguments.
    fn call(name: &str, args: &[Value]) -> Value {
        let mut exprs: Vec<Expr> = args.iter().cloned().map(Expr::Literal).collect();
        let func = resolve(name, &mut exprs).unwrap();
        let values = exprs
            .into_iter()
            .map(|e| match e {
                Expr::Literal(v) => v,
                _ => unreachable!(),
            })
            .collect();
        func.call(values)
    }

    #[test]
    fn string_functions() {
        assert_eq!(call("lower", &[json!("AbC")]), json!("abc"));
        assert_eq!(call("UPPER", &[json!("abc")]), json!("ABC"));
        assert_eq!(call("trim", &[json!("  a b ")]), json!("a b"));
        assert_eq!(call("ltrim", &[json!("  a ")]), json!("a "));
        assert_eq!(call("rtrim", &[json!("  a ")]), json!("  a"));
        assert_eq!(call("concat", &[json!("t/"), json!(1), json!(true)]), json!("t/1true"));
        assert_eq!(call("substr", &[json!("abcdef"), json!(2)]), json!("cdef"));
        assert_eq!(call("substr", &[json!("abcdef"), json!(2), json!(3)]), json!("cde"));
        assert_eq!(call("split", &[json!("/a/b//c"), json!("/")]), json!(["a", "b", "c"]));
        assert_eq!(call("tokens", &[json!("a/b c"), json!("/ ")]), json!(["a", "b", "c"]));
        assert_eq!(call("nth", &[json!(2), json!(["a", "b"])]), json!("b"));
        assert_eq!(call("nth", &[json!(3), json!(["a", "b"])]), Value::Null);
        assert_eq!(call("replace", &[json!("a-b-c"), json!("-"), json!("+")]), json!("a+b+c"));
        assert_eq!(call("regex_match", &[json!("dev-42"), json!("^dev-[0-9]+$")]), json!(true));
        assert_eq!(call("regex_match", &[json!("host"), json!("^dev")]), json!(false));
        assert_eq!(call("regex_replace", &[json!("a1b22"), json!("[0-9]+"), json!("#")]), json!("a#b#"));
        assert_eq!(call("strlen", &[json!("héllo")]), json!(5));
        assert_eq!(call("str", &[json!(31.5)]), json!("31.5"));
        assert_eq!(call("int", &[json!("42")]), json!(42));
        assert_eq!(call("int", &[json!(3.9)]), json!(3));
        assert_eq!(call("float", &[json!("2")]), json!(2.0));
        assert_eq!(call("lower", &[Value::Null]), Value::Null);
    }

    #[test]
    fn math_functions() {
        assert_eq!(call("abs", &[json!(-3)]), json!(3));
        assert_eq!(call("abs", &[json!(-2.5)]), json!(2.5));
        assert_eq!(call("ceil", &[json!(1.2)]), json!(2));
        assert_eq!(call("floor", &[json!(-1.2)]), json!(-2));
        assert_eq!(call("round", &[json!(2.5)]), json!(3));
        assert_eq!(call("sqrt", &[json!(16)]), json!(4.0));
        assert_eq!(call("sqrt", &[json!(-1)]), Value::Null);
        assert_eq!(call("power", &[json!(2), json!(10)]), json!(1024.0));
        assert_eq!(call("mod", &[json!(7), json!(3)]), json!(1));
        assert_eq!(call("mod", &[json!(7), json!(0)]), Value::Null);
        assert_eq!(call("mod", &[json!(7.5), json!(2)]), json!(1.5));
        assert_eq!(call("abs", &[json!("x")]), Value::Null);
    }

    #[test]
    fn json_base64_and_hash_functions() {
        assert_eq!(call("json_encode", &[json!({"a": [1, "x"]})]), json!(r#"{"a":[1,"x"]}"#));
        assert_eq!(call("json_decode", &[json!(r#"{"a": [1, 2]}"#)]), json!({"a": [1, 2]}));
        assert_eq!(call("json_decode", &[json!("{nope")]), Value::Null);
        assert_eq!(call("base64_encode", &[json!("hello")]), json!("aGVsbG8="));
        assert_eq!(call("base64_decode", &[json!("aGVsbG8=")]), json!("hello"));
        assert_eq!(call("base64_decode", &[json!("***")]), Value::Null);
        assert_eq!(call("md5", &[json!("abc")]), json!("900150983cd24fb0d6963f7d28e17f72"));
        assert_eq!(call("sha1", &[json!("abc")]), json!("a9993e364706816aba3e25717850c26c9cd0d89d"));
        assert_eq!(
            call("sha256", &[json!("abc")]),
            json!("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
        );
    }

    #[test]
    fn time_functions() {
        let now = call("now_timestamp", &[json!("millisecond")]).as_i64().unwrap();
        assert!(now > 1_700_000_000_000);
        let secs = call("now_timestamp", &[]).as_i64().unwrap();
        assert!((now / 1000 - secs).abs() <= 1);
        assert_eq!(call("unix_ts_to_rfc3339", &[json!(1650018960)]), json!("2022-04-15T10:36:00Z"));
        assert_eq!(
            call("unix_ts_to_rfc3339", &[json!(1650018960123_i64), json!("millisecond")]),
            json!("2022-04-15T10:36:00.123Z")
        );
        assert_eq!(call("rfc3339_to_unix_ts", &[json!("2022-04-15T18:36:00+08:00")]), json!(1650018960));
        assert_eq!(
            call(
                "format_date",
                &[json!("second"), json!("+08:00"), json!("%Y-%m-%d %H:%M:%S%:z"), json!(1650018960)]
            ),
            json!("2022-04-15 18:36:00+08:00")
        );
        assert_eq!(
            call(
                "format_date",
                &[json!("millisecond"), json!("Z"), json!("%H:%M:%S.%3N %z %%"), json!(1650018960123_i64)]
            ),
            json!("10:36:00.123 +0000 %")
        );
        assert_eq!(
            call("format_date", &[json!("second"), json!(-3600), json!("%H %::z"), json!(0)]),
            json!("23 -01:00:00")
        );
    }

    #[test]
    fn bad_calls_are_refused_up_front() {
        let err = |name: &str, args: Vec<Value>| {
            let mut exprs = args.into_iter().map(Expr::Literal).collect();
            resolve(name, &mut exprs).unwrap_err()
        };
        assert_eq!(err("lenght", vec![json!("a")]), "unknown function `lenght`");
        assert_eq!(err("lowr", vec![json!("a")]), "unknown function `lowr`; did you mean lower?");
        assert_eq!(err("lower", vec![]), "function `lower` takes 1 argument, got 0");
        assert_eq!(err("substr", vec![json!("a")]), "function `substr` takes 2 to 3 arguments, got 1");
        assert!(err("regex_match", vec![json!("a"), json!("(")]).contains("invalid regular expression"));
        assert!(err("now_timestamp", vec![json!("hour")]).contains("unknown time unit \"hour\""));
        assert!(
            err("format_date", vec![json!("second"), json!("+8"), json!("%Y")]).contains("invalid offset")
        );
        assert!(err("format_date", vec![json!("second"), json!("Z"), json!("%Q")])
            .contains("unknown directive `%Q`"));
    }

    #[test]
    fn every_function_is_documented() {
        let docs = include_str!("../../../docs/rules.md");
        for name in names() {
            assert!(docs.contains(&format!("`{name}(")), "docs/rules.md does not describe {name}");
        }
    }
}
