//! Parsing a rule's SQL with sqlparser and compiling it: sources checked, field names resolved,
//! functions looked up and literals converted, so that evaluation parses nothing.

use std::cell::Cell;
use std::collections::HashMap;

use braid_proto::topic;
use serde_json::{Number, Value};
use sqlparser::ast::{self as sql, Spanned};
use sqlparser::dialect::Dialect;
use sqlparser::parser::{Parser, ParserError};
use sqlparser::tokenizer::{Span, Token};

use crate::context::Field;
use crate::error::RuleError;
use crate::events::Event;
use crate::functions::{self, Func};
use crate::value::Step;

/// EMQX's SQL: ANSI SQL plus the topic-match operator `=~`.
#[derive(Debug)]
struct RuleDialect;

impl Dialect for RuleDialect {
    fn is_identifier_start(&self, ch: char) -> bool {
        ch.is_alphabetic() || ch == '_'
    }

    fn is_identifier_part(&self, ch: char) -> bool {
        ch.is_alphanumeric() || ch == '_'
    }

    /// `a =~ b`, which the tokenizer yields as `=` directly followed by `~`, is parsed as the
    /// binary operator `=~`, at the precedence of `=`.
    fn parse_infix(
        &self,
        parser: &mut Parser,
        expr: &sql::Expr,
        precedence: u8,
    ) -> Option<Result<sql::Expr, ParserError>> {
        let [eq, tilde] = parser.peek_tokens_with_location();
        if eq.token != Token::Eq || tilde.token != Token::Tilde || eq.span.end != tilde.span.start {
            return None;
        }
        parser.advance_token();
        parser.advance_token();
        Some(parser.parse_subexpr(precedence).map(|right| sql::Expr::BinaryOp {
            left: Box::new(expr.clone()),
            op: sql::BinaryOperator::Custom("=~".into()),
            right: Box::new(right),
        }))
    }
}

/// A rule's SQL, compiled.
#[derive(Debug, Clone)]
pub(crate) struct Query {
    /// Topic filters in FROM.
    pub(crate) filters: Vec<String>,
    /// Client events in FROM.
    pub(crate) events: Vec<Event>,
    /// What SELECT writes, in order.
    pub(crate) outputs: Vec<Output>,
    /// The WHERE condition.
    pub(crate) condition: Option<Expr>,
}

/// One item of SELECT.
#[derive(Debug, Clone)]
pub(crate) enum Output {
    /// `*`: every field of the source.
    All,
    /// An expression's value, written at `keys` (more than one key nests objects).
    Value { keys: Vec<String>, expr: Expr },
}

/// A compiled expression.
#[derive(Debug, Clone)]
pub(crate) enum Expr {
    Literal(Value),
    Field(Field),
    /// A path into a value: `payload.a.list[1]`.
    Path(Box<Expr>, Vec<Step>),
    Not(Box<Expr>),
    Neg(Box<Expr>),
    And(Box<Expr>, Box<Expr>),
    Or(Box<Expr>, Box<Expr>),
    Compare(CmpOp, Box<Expr>, Box<Expr>),
    Arith(ArithOp, Box<Expr>, Box<Expr>),
    /// `topic =~ filter`.
    TopicMatch(Box<Expr>, Box<Expr>),
    IsNull(Box<Expr>),
    In {
        expr: Box<Expr>,
        list: Vec<Expr>,
        negated: bool,
    },
    Call(Func, Vec<Expr>),
}

/// A comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

/// An arithmetic operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ArithOp {
    Add,
    Sub,
    Mul,
    Div,
    Rem,
}

/// Parses and compiles `sql`.
pub(crate) fn compile(sql: &str) -> Result<Query, RuleError> {
    if sql.split_whitespace().next().is_some_and(|w| w.eq_ignore_ascii_case("FOREACH")) {
        return Err(RuleError::new("FOREACH is not supported; a rule is SELECT ... FROM ... [WHERE ...]"));
    }
    let statements = Parser::parse_sql(&RuleDialect, sql).map_err(|e| RuleError::from_parser(e, sql))?;
    let statement = match statements.as_slice() {
        [statement] => statement,
        [] => return Err(RuleError::new("the rule is empty; expected SELECT ... FROM ...")),
        [_, second, ..] => return Err(RuleError::at(second.span(), "a rule is a single SELECT statement")),
    };
    let sql::Statement::Query(query) = statement else {
        let verb = sql.split_whitespace().next().unwrap_or_default().to_uppercase();
        return Err(RuleError::at(statement.span(), format!("a rule is a SELECT statement, not {verb}")));
    };
    let select = plain_select(query)?;
    let (filters, events) = sources(select)?;
    let publish = (!filters.is_empty()).then_some(Event::MessagePublish);
    let mut fields = Vec::new();
    for name in events.iter().copied().chain(publish).flat_map(Event::fields) {
        if !fields.contains(&name) {
            fields.push(name);
        }
    }
    let mut scope = Scope { fields, aliases: HashMap::new(), depth: Cell::new(0) };
    let mut outputs = Vec::new();
    for item in &select.projection {
        outputs.push(scope.output(item)?);
    }
    // WHERE may use the names SELECT gives with AS.
    for output in &outputs {
        if let Output::Value { keys, expr } = output {
            if let [name] = keys.as_slice() {
                scope.aliases.entry(name.clone()).or_insert_with(|| expr.clone());
            }
        }
    }
    let condition = select.selection.as_ref().map(|e| scope.expr(e)).transpose()?;
    only_known_clauses(query, select)?;
    Ok(Query { filters, events, outputs, condition })
}

/// The SELECT of `query`, refusing everything but `SELECT ... FROM ... [WHERE ...]`.
fn plain_select(query: &sql::Query) -> Result<&sql::Select, RuleError> {
    let one_at_a_time = "a rule sees one message at a time";
    if let Some(with) = &query.with {
        return Err(RuleError::at(with.span(), "WITH is not supported"));
    }
    if let Some(order_by) = &query.order_by {
        return Err(RuleError::at(order_by.span(), format!("ORDER BY is not supported: {one_at_a_time}")));
    }
    if let Some(limit) = &query.limit_clause {
        return Err(RuleError::at(limit.span(), format!("LIMIT is not supported: {one_at_a_time}")));
    }
    let select = match &*query.body {
        sql::SetExpr::Select(select) => select,
        sql::SetExpr::SetOperation { op, .. } => {
            return Err(RuleError::at(query.body.span(), format!("{op} is not supported")));
        }
        sql::SetExpr::Query(_) => {
            return Err(RuleError::at(query.body.span(), "subqueries are not supported"))
        }
        other => return Err(RuleError::at(other.span(), "a rule is SELECT ... FROM ... [WHERE ...]")),
    };
    if select.from.is_empty() {
        return Err(RuleError::at(
            select.select_token.0.span,
            "a rule needs FROM with a topic filter or an event",
        ));
    }
    let refuse = |span: Span, what: &str| Err(RuleError::at(span, format!("{what} is not supported")));
    if select.distinct.is_some() {
        return refuse(select.select_token.0.span, "DISTINCT");
    }
    if let Some(into) = &select.into {
        return refuse(into.span(), "SELECT INTO");
    }
    if let sql::GroupByExpr::Expressions(exprs, _) = &select.group_by {
        if let Some(first) = exprs.first() {
            return Err(RuleError::at(first.span(), format!("GROUP BY is not supported: {one_at_a_time}")));
        }
    } else {
        return Err(RuleError::new(format!("GROUP BY is not supported: {one_at_a_time}")));
    }
    if let Some(having) = &select.having {
        return Err(RuleError::at(having.span(), format!("HAVING is not supported: {one_at_a_time}")));
    }
    for from in &select.from {
        if let Some(join) = from.joins.first() {
            return Err(RuleError::at(
                join.relation.span(),
                "JOIN is not supported: FROM lists topic filters and events",
            ));
        }
    }
    Ok(select)
}

/// Refuses clauses [`plain_select`] does not look for (TOP, QUALIFY, WINDOW, ...): they show
/// as text beyond the parts a rule uses. This writes the whole statement out, so it runs after
/// the expressions passed the depth check.
fn only_known_clauses(query: &sql::Query, select: &sql::Select) -> Result<(), RuleError> {
    let used = format!(
        "SELECT {} FROM {}{}",
        list(&select.projection),
        list(&select.from),
        select.selection.as_ref().map(|w| format!(" WHERE {w}")).unwrap_or_default()
    );
    if query.to_string() != used {
        return Err(RuleError::at(
            select.select_token.0.span,
            "a rule is SELECT ... FROM ... [WHERE ...], without other clauses",
        ));
    }
    Ok(())
}

/// `items` as SQL, comma separated.
fn list<T: std::fmt::Display>(items: &[T]) -> String {
    items.iter().map(T::to_string).collect::<Vec<_>>().join(", ")
}

/// The topic filters and client events in FROM.
fn sources(select: &sql::Select) -> Result<(Vec<String>, Vec<Event>), RuleError> {
    let (mut filters, mut events) = (Vec::new(), Vec::new());
    for from in &select.from {
        let span = from.relation.span();
        let source = match &from.relation {
            sql::TableFactor::Table { name, alias: None, args: None, .. } => match name.0.as_slice() {
                [sql::ObjectNamePart::Identifier(ident)] if ident.quote_style == Some('"') => &ident.value,
                _ => {
                    return Err(RuleError::at(
                        span,
                        format!("a source is a double-quoted topic filter or event, such as \"t/#\"; found {name}"),
                    ));
                }
            },
            sql::TableFactor::Derived { .. } => {
                return Err(RuleError::at(span, "subqueries are not supported"))
            }
            other => return Err(RuleError::at(span, format!("unsupported source {other}"))),
        };
        if source.starts_with("$events/") {
            let event = Event::from_topic(source).ok_or_else(|| {
                let near = nearest(source, Event::CLIENT_EVENTS.iter().filter_map(|e| e.topic()));
                let hint = near.map(|n| format!("; did you mean {n}?")).unwrap_or_default();
                RuleError::at(span, format!("unknown event `{source}`{hint}"))
            })?;
            events.push(event);
        } else if !matches!(topic::parse_shared(source), Ok(None)) {
            return Err(RuleError::at(
                span,
                format!("`{source}` is a shared subscription; a source is a plain topic filter"),
            ));
        } else if topic::valid_topic_filter(source) {
            filters.push(source.clone());
        } else {
            return Err(RuleError::at(span, format!("invalid topic filter `{source}`")));
        }
    }
    Ok((filters, events))
}

/// Names an expression may use: the fields of the sources, and (in WHERE) SELECT's aliases.
struct Scope {
    /// The names of the sources' fields.
    fields: Vec<&'static str>,
    aliases: HashMap<String, Expr>,
    /// How deep in an expression compiling is, to refuse one too deep to evaluate safely.
    depth: Cell<usize>,
}

/// The deepest an expression may nest (`a AND b AND ...` nests once per operator).
const MAX_DEPTH: usize = 200;

impl Scope {
    /// One SELECT item.
    fn output(&self, item: &sql::SelectItem) -> Result<Output, RuleError> {
        match item {
            sql::SelectItem::Wildcard(_) if item.to_string() == "*" => Ok(Output::All),
            sql::SelectItem::UnnamedExpr(e) => {
                let expr = self.expr(e)?;
                let keys = match e {
                    sql::Expr::Identifier(ident) if ident.quote_style.is_none() => vec![ident.value.clone()],
                    sql::Expr::CompoundIdentifier(parts) => parts.iter().map(|p| p.value.clone()).collect(),
                    other => vec![other.to_string()],
                };
                Ok(Output::Value { keys, expr })
            }
            sql::SelectItem::ExprWithAlias { expr, alias } => {
                let keys = alias.value.split('.').map(str::to_owned).collect();
                Ok(Output::Value { keys, expr: self.expr(expr)? })
            }
            other => Err(RuleError::at(other.span(), format!("unsupported SELECT item `{other}`"))),
        }
    }

    /// Compiles an expression.
    fn expr(&self, e: &sql::Expr) -> Result<Expr, RuleError> {
        let depth = self.depth.get();
        if depth == MAX_DEPTH {
            // No position: finding one would walk the rest of the too-deep expression.
            return Err(RuleError::new(format!("an expression nests more than {MAX_DEPTH} deep")));
        }
        self.depth.set(depth + 1);
        let compiled = self.compile_expr(e);
        self.depth.set(depth);
        compiled
    }

    /// [`Scope::expr`] below the depth check.
    fn compile_expr(&self, e: &sql::Expr) -> Result<Expr, RuleError> {
        let boxed = |e: &sql::Expr| self.expr(e).map(Box::new);
        let unsupported = |what: &str| Err(RuleError::at(e.span(), what.to_owned()));
        Ok(match e {
            // EMQX reads "text" in an expression as a string.
            sql::Expr::Identifier(ident) if ident.quote_style == Some('"') => {
                Expr::Literal(Value::String(ident.value.clone()))
            }
            sql::Expr::Identifier(ident) => self.path(e, ident, Vec::new())?,
            sql::Expr::CompoundIdentifier(parts) => {
                let steps = parts[1..].iter().map(|p| Step::Key(p.value.clone())).collect();
                self.path(e, &parts[0], steps)?
            }
            sql::Expr::CompoundFieldAccess { root, access_chain } => {
                let (root, mut steps) = match &**root {
                    sql::Expr::Identifier(ident) => (ident, Vec::new()),
                    sql::Expr::CompoundIdentifier(parts) => {
                        (&parts[0], parts[1..].iter().map(|p| Step::Key(p.value.clone())).collect())
                    }
                    other => return Err(RuleError::at(other.span(), format!("`{other}` has no fields"))),
                };
                for access in access_chain {
                    steps.push(access_step(access, e.span())?);
                }
                self.path(e, root, steps)?
            }
            sql::Expr::Value(v) => Expr::Literal(
                literal(&v.value)
                    .ok_or_else(|| RuleError::at(v.span, format!("unsupported literal `{}`", v.value)))?,
            ),
            sql::Expr::Nested(inner) => self.expr(inner)?,
            sql::Expr::UnaryOp { op, expr } => match op {
                sql::UnaryOperator::Not => Expr::Not(boxed(expr)?),
                sql::UnaryOperator::Minus => Expr::Neg(boxed(expr)?),
                sql::UnaryOperator::Plus => self.expr(expr)?,
                other => return unsupported(&format!("unsupported operator `{other}`")),
            },
            sql::Expr::BinaryOp { left, op, right } => self.binary(e, left, op, right)?,
            sql::Expr::IsNull(inner) => Expr::IsNull(boxed(inner)?),
            sql::Expr::IsNotNull(inner) => Expr::Not(Box::new(Expr::IsNull(boxed(inner)?))),
            sql::Expr::In { expr, target: sql::InTarget::List(list), negated, global: false } => Expr::In {
                expr: boxed(expr)?,
                list: list.iter().map(|e| self.expr(e)).collect::<Result<_, _>>()?,
                negated: *negated,
            },
            sql::Expr::Function(f) => self.function(e, f)?,
            sql::Expr::Trim { expr, trim_where: None, trim_what: None, trim_characters: None } => {
                self.call(e, "trim", vec![self.expr(expr)?])?
            }
            sql::Expr::Substring { expr, substring_from, substring_for, .. } => {
                let mut args = vec![self.expr(expr)?];
                for arg in [substring_from, substring_for].into_iter().flatten() {
                    args.push(self.expr(arg)?);
                }
                self.call(e, "substr", args)?
            }
            sql::Expr::Ceil {
                expr,
                field: sql::CeilFloorKind::DateTimeField(sql::DateTimeField::NoDateTime),
            } => self.call(e, "ceil", vec![self.expr(expr)?])?,
            sql::Expr::Floor {
                expr,
                field: sql::CeilFloorKind::DateTimeField(sql::DateTimeField::NoDateTime),
            } => self.call(e, "floor", vec![self.expr(expr)?])?,
            sql::Expr::Subquery(_) | sql::Expr::Exists { .. } | sql::Expr::In { .. } => {
                return unsupported("subqueries are not supported");
            }
            sql::Expr::Case { .. } => return unsupported("CASE is not supported"),
            sql::Expr::Between { .. } => {
                return unsupported("BETWEEN is not supported; use x >= a AND x <= b")
            }
            sql::Expr::Like { .. } | sql::Expr::ILike { .. } => {
                return unsupported("LIKE is not supported; use regex_match(x, '...') or =~ for topics");
            }
            sql::Expr::Cast { .. } => {
                return unsupported("CAST is not supported; use int(x), float(x) or str(x)")
            }
            other => return unsupported(&format!("unsupported expression `{other}`")),
        })
    }

    /// `left op right`.
    fn binary(
        &self,
        e: &sql::Expr,
        left: &sql::Expr,
        op: &sql::BinaryOperator,
        right: &sql::Expr,
    ) -> Result<Expr, RuleError> {
        use sql::BinaryOperator as B;
        let (l, r) = (Box::new(self.expr(left)?), Box::new(self.expr(right)?));
        Ok(match op {
            B::And => Expr::And(l, r),
            B::Or => Expr::Or(l, r),
            B::Eq => Expr::Compare(CmpOp::Eq, l, r),
            B::NotEq => Expr::Compare(CmpOp::Ne, l, r),
            B::Lt => Expr::Compare(CmpOp::Lt, l, r),
            B::LtEq => Expr::Compare(CmpOp::Le, l, r),
            B::Gt => Expr::Compare(CmpOp::Gt, l, r),
            B::GtEq => Expr::Compare(CmpOp::Ge, l, r),
            B::Plus => Expr::Arith(ArithOp::Add, l, r),
            B::Minus => Expr::Arith(ArithOp::Sub, l, r),
            B::Multiply => Expr::Arith(ArithOp::Mul, l, r),
            B::Divide => Expr::Arith(ArithOp::Div, l, r),
            B::Modulo => Expr::Arith(ArithOp::Rem, l, r),
            B::StringConcat => return self.call(e, "concat", vec![*l, *r]),
            B::Custom(op) if op == "=~" => {
                if let Expr::Literal(filter) = &*r {
                    if !filter.as_str().is_some_and(topic::valid_topic_filter) {
                        return Err(RuleError::at(
                            right.span(),
                            format!("invalid topic filter {filter} after =~"),
                        ));
                    }
                }
                Expr::TopicMatch(l, r)
            }
            other => return Err(RuleError::at(e.span(), format!("unsupported operator `{other}`"))),
        })
    }

    /// A function call as sqlparser gives it.
    fn function(&self, e: &sql::Expr, f: &sql::Function) -> Result<Expr, RuleError> {
        let name = match f.name.0.as_slice() {
            [sql::ObjectNamePart::Identifier(ident)] => ident,
            _ => return Err(RuleError::at(e.span(), format!("unknown function `{}`", f.name))),
        };
        let lower = name.value.to_ascii_lowercase();
        if matches!(lower.as_str(), "count" | "sum" | "avg" | "min" | "max") {
            let message =
                format!("aggregate function `{lower}` is not supported: a rule sees one message at a time");
            return Err(RuleError::at(e.span(), message));
        }
        let list = match &f.args {
            // A keyword sqlparser reads as a function without parentheses, such as `user`.
            sql::FunctionArguments::None => return self.path(e, name, Vec::new()),
            sql::FunctionArguments::Subquery(_) => {
                return Err(RuleError::at(e.span(), "subqueries are not supported"))
            }
            sql::FunctionArguments::List(list) => list,
        };
        let plain = f.filter.is_none()
            && f.over.is_none()
            && f.within_group.is_empty()
            && f.null_treatment.is_none()
            && matches!(f.parameters, sql::FunctionArguments::None)
            && list.duplicate_treatment.is_none()
            && list.clauses.is_empty();
        if !plain {
            return Err(RuleError::at(
                e.span(),
                format!("unsupported call `{e}`: only name(arg, ...) is supported"),
            ));
        }
        let mut args = Vec::with_capacity(list.args.len());
        for arg in &list.args {
            match arg {
                sql::FunctionArg::Unnamed(sql::FunctionArgExpr::Expr(a)) => args.push(self.expr(a)?),
                other => {
                    return Err(RuleError::at(e.span(), format!("unsupported argument `{other}` in `{e}`")))
                }
            }
        }
        self.call(e, &name.value, args)
    }

    /// The function `name` called with `args`.
    fn call(&self, e: &sql::Expr, name: &str, mut args: Vec<Expr>) -> Result<Expr, RuleError> {
        let func = functions::resolve(name, &mut args).map_err(|msg| RuleError::at(e.span(), msg))?;
        Ok(Expr::Call(func, args))
    }

    /// The field or alias `root` followed by `steps`; `e` is the whole expression, for messages.
    fn path(&self, e: &sql::Expr, root: &sql::Ident, steps: Vec<Step>) -> Result<Expr, RuleError> {
        let base = match self.aliases.get(&root.value) {
            Some(alias) => alias.clone(),
            None => Expr::Field(self.field(e, root)?),
        };
        Ok(if steps.is_empty() { base } else { Expr::Path(Box::new(base), steps) })
    }

    /// The field `root` of one of the sources.
    fn field(&self, e: &sql::Expr, root: &sql::Ident) -> Result<Field, RuleError> {
        let names = &self.fields;
        if let Some(name) = names.iter().find(|n| **n == root.value) {
            return Ok(Field::named(name));
        }
        let whole = e.to_string();
        let message = match nearest(
            &root.value,
            names.iter().copied().chain(self.aliases.keys().map(String::as_str)),
        ) {
            Some(near) => {
                let rest = whole.strip_prefix(&root.to_string()).unwrap_or_default();
                format!("unknown field `{whole}`; did you mean {near}{rest}?")
            }
            None => format!("unknown field `{whole}`; the sources have {}", names.join(", ")),
        };
        Err(RuleError::at(root.span, message))
    }
}

/// One step of `a[1]`, `a['key']` or `a.b` after a subscript, in the path that `whole` spans.
fn access_step(access: &sql::AccessExpr, whole: Span) -> Result<Step, RuleError> {
    let bad = |span: Span| {
        RuleError::at(span, "an index is an integer literal (1 is the first element) or a quoted key")
    };
    match access {
        sql::AccessExpr::Dot(sql::Expr::Identifier(ident)) => Ok(Step::Key(ident.value.clone())),
        sql::AccessExpr::Dot(other) => {
            Err(RuleError::at(other.span(), format!("unsupported field access `.{other}`")))
        }
        sql::AccessExpr::Subscript(sql::Subscript::Index { index }) => {
            let (negative, value) = match index {
                sql::Expr::UnaryOp { op: sql::UnaryOperator::Minus, expr } => (true, &**expr),
                other => (false, other),
            };
            let sql::Expr::Value(v) = value else { return Err(bad(value.span())) };
            match (&v.value, negative) {
                (sql::Value::SingleQuotedString(key), false) => Ok(Step::Key(key.clone())),
                (sql::Value::Number(n, _), _) => match n.parse::<i64>() {
                    Ok(0) => {
                        Err(RuleError::at(v.span, "index 0: elements are counted from 1 (-1 is the last)"))
                    }
                    Ok(n) => Ok(Step::Index(if negative { -n } else { n })),
                    Err(_) => Err(bad(v.span)),
                },
                _ => Err(bad(v.span)),
            }
        }
        sql::AccessExpr::Subscript(sql::Subscript::Slice { .. }) => Err(bad(whole)),
    }
}

/// A SQL literal as a JSON value; `None` for kinds rules do not have (hex strings, ...).
fn literal(value: &sql::Value) -> Option<Value> {
    match value {
        sql::Value::Number(n, _) => n
            .parse::<i64>()
            .map(Value::from)
            .ok()
            .or_else(|| n.parse::<f64>().ok().and_then(Number::from_f64).map(Value::Number)),
        sql::Value::SingleQuotedString(s) | sql::Value::DoubleQuotedString(s) => {
            Some(Value::String(s.clone()))
        }
        sql::Value::Boolean(b) => Some(Value::Bool(*b)),
        sql::Value::Null => Some(Value::Null),
        _ => None,
    }
}

/// The candidate closest to `name` by edit distance, if it is close enough to be a typo or
/// `name` is the start of it (`user` for `username`).
pub(crate) fn nearest<'c>(name: &str, candidates: impl Iterator<Item = &'c str>) -> Option<&'c str> {
    let limit = (name.chars().count() / 3).clamp(1, 3);
    candidates
        .map(|c| (edit_distance(name, c), c))
        .filter(|(d, c)| *d <= limit || (name.len() >= 3 && c.starts_with(name)))
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// Levenshtein distance, in characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let substitute = diagonal + usize::from(ca != *cb);
            diagonal = row[j + 1];
            row[j + 1] = substitute.min(row[j] + 1).min(diagonal + 1);
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edit_distance_counts_typos() {
        assert_eq!(edit_distance("paylod", "payload"), 1);
        assert_eq!(edit_distance("lenght", "length"), 2);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(nearest("clientd", ["clientid", "username"].into_iter()), Some("clientid"));
        assert_eq!(nearest("xyz", ["clientid", "username"].into_iter()), None);
    }

    #[test]
    fn topic_match_binds_like_equals() {
        let query = compile(r#"SELECT * FROM "t/#" WHERE topic =~ 't/+' AND qos = 1"#).unwrap();
        assert!(matches!(query.condition, Some(Expr::And(ref l, _)) if matches!(**l, Expr::TopicMatch(..))));
    }
}
