//! Evaluating a compiled rule on one message or event. Nothing here fails: a missing field or a
//! value of the wrong kind is null, and a comparison with null is false.

use std::cell::OnceCell;

use braid_proto::topic;
use serde_json::{Map, Value};

use crate::compile::{ArithOp, CmpOp, Expr, Output};
use crate::context::{Context, Field};
use crate::value::{equal, number, order, step, truthy, Num, Step};

/// One evaluation: the context, and its payload parsed as JSON the first time a path needs it
/// (shared by the rules run on one message).
pub(crate) struct Eval<'c, 'a> {
    ctx: &'c Context<'a>,
    payload: &'c OnceCell<Value>,
}

impl<'c, 'a> Eval<'c, 'a> {
    /// An evaluation of `ctx`, its payload parsed into `payload` when first read.
    pub(crate) fn new(ctx: &'c Context<'a>, payload: &'c OnceCell<Value>) -> Self {
        Eval { ctx, payload }
    }

    /// True when `e` is the boolean `true`.
    pub(crate) fn test(&self, e: &Expr) -> bool {
        truthy(&self.value(e))
    }

    /// The object SELECT makes.
    pub(crate) fn output(&self, outputs: &[Output]) -> Map<String, Value> {
        let mut out = Map::new();
        for output in outputs {
            match output {
                Output::All => {
                    for name in self.ctx.event.fields() {
                        let field = Field::named(name);
                        if field.present(self.ctx) {
                            out.insert(name.to_owned(), field.read(self.ctx));
                        }
                    }
                }
                Output::Value { keys, expr } => insert(&mut out, keys, self.value(expr)),
            }
        }
        out
    }

    /// The value of `e`.
    pub(crate) fn value(&self, e: &Expr) -> Value {
        match e {
            Expr::Literal(v) => v.clone(),
            Expr::Field(field) => field.read(self.ctx),
            Expr::Path(base, steps) => self.path(base, steps),
            Expr::Not(e) => Value::Bool(!self.test(e)),
            Expr::Neg(e) => match number(&self.value(e)) {
                Some(Num::Int(i)) => i.checked_neg().map_or(Num::Float(-(i as f64)), Num::Int).value(),
                Some(Num::Float(f)) => Num::Float(-f).value(),
                None => Value::Null,
            },
            Expr::And(a, b) => Value::Bool(self.test(a) && self.test(b)),
            Expr::Or(a, b) => Value::Bool(self.test(a) || self.test(b)),
            Expr::Compare(op, a, b) => Value::Bool(op.holds(&self.value(a), &self.value(b))),
            Expr::Arith(op, a, b) => match (number(&self.value(a)), number(&self.value(b))) {
                (Some(x), Some(y)) => op.apply(x, y).map_or(Value::Null, Num::value),
                _ => Value::Null,
            },
            Expr::TopicMatch(name, filter) => {
                let (name, filter) = (self.value(name), self.value(filter));
                let matched = match (name.as_str(), filter.as_str()) {
                    (Some(name), Some(filter)) => {
                        topic::valid_topic_filter(filter) && topic::matches(filter, name)
                    }
                    _ => false,
                };
                Value::Bool(matched)
            }
            Expr::IsNull(e) => Value::Bool(self.value(e).is_null()),
            Expr::In { expr, list, negated } => {
                let v = self.value(expr);
                Value::Bool(!v.is_null() && list.iter().any(|item| equal(&v, &self.value(item))) != *negated)
            }
            Expr::Call(func, args) => func.call(args.iter().map(|a| self.value(a)).collect()),
        }
    }

    /// `base` followed by `steps`. A path into `payload` reads the payload as JSON (parsed once
    /// per evaluation); a payload that is not JSON has no fields.
    fn path(&self, base: &Expr, steps: &[Step]) -> Value {
        let walk = |v: &Value| steps.iter().try_fold(v, step).cloned().unwrap_or(Value::Null);
        match base {
            Expr::Field(Field::Payload) if self.ctx.event.carries_message() => walk(
                self.payload.get_or_init(|| serde_json::from_slice(self.ctx.payload).unwrap_or(Value::Null)),
            ),
            other => walk(&self.value(other)),
        }
    }
}

/// Writes `value` at the path `keys` in `map`, making objects on the way.
fn insert(map: &mut Map<String, Value>, keys: &[String], value: Value) {
    match keys {
        [] => {}
        [last] => {
            map.insert(last.clone(), value);
        }
        [first, rest @ ..] => {
            let slot = map.entry(first.clone()).or_insert(Value::Null);
            if !slot.is_object() {
                *slot = Value::Object(Map::new());
            }
            if let Value::Object(inner) = slot {
                insert(inner, rest, value);
            }
        }
    }
}

impl CmpOp {
    /// True when `a op b` holds; never when either is null.
    fn holds(self, a: &Value, b: &Value) -> bool {
        match self {
            CmpOp::Eq => equal(a, b),
            CmpOp::Ne => !a.is_null() && !b.is_null() && !equal(a, b),
            CmpOp::Lt => order(a, b).is_some_and(|o| o.is_lt()),
            CmpOp::Le => order(a, b).is_some_and(|o| o.is_le()),
            CmpOp::Gt => order(a, b).is_some_and(|o| o.is_gt()),
            CmpOp::Ge => order(a, b).is_some_and(|o| o.is_ge()),
        }
    }
}

impl ArithOp {
    /// `x op y`; integers stay integers unless they overflow, `/` always divides as floats, and
    /// dividing by zero gives `None`.
    fn apply(self, x: Num, y: Num) -> Option<Num> {
        if let (Num::Int(a), Num::Int(b)) = (x, y) {
            let exact = match self {
                ArithOp::Add => a.checked_add(b),
                ArithOp::Sub => a.checked_sub(b),
                ArithOp::Mul => a.checked_mul(b),
                ArithOp::Rem => return a.checked_rem(b).map(Num::Int),
                ArithOp::Div => None,
            };
            if let Some(n) = exact {
                return Some(Num::Int(n));
            }
        }
        let (a, b) = (x.float(), y.float());
        match self {
            ArithOp::Add => Some(Num::Float(a + b)),
            ArithOp::Sub => Some(Num::Float(a - b)),
            ArithOp::Mul => Some(Num::Float(a * b)),
            ArithOp::Div | ArithOp::Rem if b == 0.0 => None,
            ArithOp::Div => Some(Num::Float(a / b)),
            ArithOp::Rem => Some(Num::Float(a % b)),
        }
    }
}
