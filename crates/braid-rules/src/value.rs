//! Conversions and comparisons on JSON values, shared by the evaluator, the functions and
//! templates. Missing values are null, and nothing here fails: a value of the wrong kind gives
//! `None`.

use std::borrow::Cow;
use std::cmp::Ordering;

use serde_json::{Number, Value};

/// One step of a path into a value: `.key` or `[n]`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Step {
    /// An object's member.
    Key(String),
    /// An array's element, counted from 1; negative counts from the end (`-1` is the last).
    Index(i64),
}

/// The value one step below `value`, if there is one.
pub(crate) fn step<'v>(value: &'v Value, step: &Step) -> Option<&'v Value> {
    match (value, step) {
        (Value::Object(map), Step::Key(key)) => map.get(key),
        (Value::Array(items), Step::Index(n)) => {
            let len = i64::try_from(items.len()).ok()?;
            let i = if *n < 0 { len + n } else { n - 1 };
            items.get(usize::try_from(i).ok()?)
        }
        _ => None,
    }
}

/// A number, integer or not.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Num {
    Int(i64),
    Float(f64),
}

impl Num {
    /// The number as a float.
    pub(crate) fn float(self) -> f64 {
        match self {
            Num::Int(i) => i as f64,
            Num::Float(f) => f,
        }
    }

    /// The number as a JSON value; a float that is not finite is null.
    pub(crate) fn value(self) -> Value {
        match self {
            Num::Int(i) => Value::from(i),
            Num::Float(f) => Number::from_f64(f).map_or(Value::Null, Value::Number),
        }
    }
}

/// `value` as a number: a JSON number, or a string that reads as one (`"31.5"`).
pub(crate) fn number(value: &Value) -> Option<Num> {
    match value {
        Value::Number(n) => {
            Some(n.as_i64().map_or_else(|| Num::Float(n.as_f64().unwrap_or(f64::NAN)), Num::Int))
        }
        Value::String(s) => {
            let s = s.trim();
            s.parse()
                .map(Num::Int)
                .ok()
                .or_else(|| s.parse().ok().filter(|f: &f64| f.is_finite()).map(Num::Float))
        }
        _ => None,
    }
}

/// `value` as text: a string as it is, a number or boolean as written, an array or object as
/// JSON; `None` for null.
pub(crate) fn text(value: &Value) -> Option<Cow<'_, str>> {
    match value {
        Value::Null => None,
        Value::String(s) => Some(Cow::Borrowed(s)),
        other => Some(Cow::Owned(other.to_string())),
    }
}

/// True only for the boolean `true`: what WHERE, AND, OR and NOT test.
pub(crate) fn truthy(value: &Value) -> bool {
    matches!(value, Value::Bool(true))
}

/// How `a` and `b` order: numbers by value (a numeric string counts as a number when the other
/// side is a number), strings and booleans as such. `None` when either is null or they do not
/// order (different kinds, arrays, objects).
pub(crate) fn order(a: &Value, b: &Value) -> Option<Ordering> {
    match (a, b) {
        (Value::String(x), Value::String(y)) => Some(x.cmp(y)),
        (Value::Bool(x), Value::Bool(y)) => Some(x.cmp(y)),
        (Value::Number(_), Value::Number(_) | Value::String(_)) | (Value::String(_), Value::Number(_)) => {
            match (number(a)?, number(b)?) {
                (Num::Int(x), Num::Int(y)) => Some(x.cmp(&y)),
                (x, y) => x.float().partial_cmp(&y.float()),
            }
        }
        _ => None,
    }
}

/// `a = b`: false when either is null; values that [`order`] compares are equal when they order
/// equal, others (arrays, objects, different kinds) when they are the same value.
pub(crate) fn equal(a: &Value, b: &Value) -> bool {
    if a.is_null() || b.is_null() {
        return false;
    }
    order(a, b).map_or(a == b, Ordering::is_eq)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn steps_count_from_one_and_from_the_end() {
        let list = json!([10, 20, 30]);
        assert_eq!(step(&list, &Step::Index(1)), Some(&json!(10)));
        assert_eq!(step(&list, &Step::Index(-1)), Some(&json!(30)));
        assert_eq!(step(&list, &Step::Index(0)), None);
        assert_eq!(step(&list, &Step::Index(4)), None);
        assert_eq!(step(&list, &Step::Key("a".into())), None);
        assert_eq!(step(&json!({"a": 1}), &Step::Key("a".into())), Some(&json!(1)));
    }

    #[test]
    fn numbers_compare_across_kinds() {
        assert_eq!(order(&json!(31.5), &json!(30)), Some(Ordering::Greater));
        assert_eq!(order(&json!("7"), &json!(10)), Some(Ordering::Less));
        assert_eq!(order(&json!("abc"), &json!(10)), None);
        assert_eq!(order(&json!("b"), &json!("a")), Some(Ordering::Greater));
        assert!(equal(&json!(1), &json!(1.0)));
        assert!(equal(&json!({"a": [1]}), &json!({"a": [1]})));
        assert!(!equal(&Value::Null, &Value::Null));
    }
}
