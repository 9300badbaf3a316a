//! Templates for actions and sinks: text with `${name}` placeholders filled from a rule's output,
//! such as `alerts/${clientid}` or `${payload.temp}`.

use std::borrow::Cow;

use serde_json::{Map, Value};

use crate::error::{Position, RuleError};
use crate::value::{step, text, Step};

/// A parsed template: text and placeholders.
#[derive(Debug, Clone, PartialEq)]
pub struct Template {
    parts: Vec<Part>,
}

#[derive(Debug, Clone, PartialEq)]
enum Part {
    Text(String),
    Placeholder(Field),
}

/// A placeholder's field: `${root.key[1]}`, an output field and a path into it.
#[derive(Debug, Clone, PartialEq)]
pub struct Field {
    root: String,
    steps: Vec<Step>,
}

impl Field {
    /// Its value in `output` (a path into a string reads the string as JSON); None when it is
    /// missing.
    pub fn value<'o>(&self, output: &'o Map<String, Value>) -> Option<Cow<'o, Value>> {
        lookup(output, &self.root, &self.steps)
    }
}

impl Template {
    /// Parses `template`. A placeholder is `${name}` followed by `.key` and `[n]` steps (`n`
    /// counts from 1, negative from the end), as in `${payload.list[1].temp}`; a `$` not followed
    /// by `{` is text. The error names the position of an unclosed or malformed placeholder.
    pub fn parse(template: &str) -> Result<Template, RuleError> {
        let mut parts = Vec::new();
        let mut text = String::new();
        let mut rest = 0;
        while let Some(found) = template[rest..].find("${") {
            let open = rest + found;
            text.push_str(&template[rest..open]);
            let body_start = open + 2;
            let Some(len) = template[body_start..].find('}') else {
                return Err(RuleError::at_position(position(template, open), "unclosed `${`: expected `}`"));
            };
            let body = &template[body_start..body_start + len];
            let (root, steps) = placeholder(body).map_err(|msg| {
                RuleError::at_position(position(template, open), format!("in `${{{body}}}`: {msg}"))
            })?;
            if !text.is_empty() {
                parts.push(Part::Text(std::mem::take(&mut text)));
            }
            parts.push(Part::Placeholder(Field { root, steps }));
            rest = body_start + len + 1;
        }
        text.push_str(&template[rest..]);
        if !text.is_empty() {
            parts.push(Part::Text(text));
        }
        Ok(Template { parts })
    }

    /// The template filled from `output` (what [`Rule::apply`](crate::Rule::apply) returns). A
    /// string value is written as it is, a number, boolean, array or object as JSON, and a missing
    /// or null value as nothing. A path into a string reads the string as JSON, so `${payload.x}`
    /// works after `SELECT *` too.
    pub fn render(&self, output: &Map<String, Value>) -> String {
        self.fill(output).0
    }

    /// The template filled from `output` as [`Template::render`] fills it, or None if a
    /// placeholder has no value there (a template that must not be filled by halves).
    pub fn render_all(&self, output: &Map<String, Value>) -> Option<String> {
        let (text, complete) = self.fill(output);
        complete.then_some(text)
    }

    /// The template filled from `output`, and whether every placeholder had a value.
    fn fill(&self, output: &Map<String, Value>) -> (String, bool) {
        let (mut out, mut complete) = (String::new(), true);
        for part in &self.parts {
            match part {
                Part::Text(t) => out.push_str(t),
                Part::Placeholder(field) => match field.value(output) {
                    Some(value) => out.push_str(&text(&value).unwrap_or_default()),
                    None => complete = false,
                },
            }
        }
        (out, complete)
    }

    /// The names its placeholders start with (`payload` for `${payload.temp}`), in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.parts.iter().filter_map(|p| match p {
            Part::Placeholder(field) => Some(field.root.as_str()),
            Part::Text(_) => None,
        })
    }

    /// The template's text with its `n`th placeholder (from 1) written as `mark(n)`, and the
    /// placeholders' fields in order: for a statement whose values go as parameters, never
    /// spliced into its text (`VALUES (${a}, ${b})` -> `VALUES ($1, $2)`).
    pub fn parameters(&self, mut mark: impl FnMut(usize) -> String) -> (String, Vec<Field>) {
        let (mut text, mut fields) = (String::new(), Vec::new());
        for part in &self.parts {
            match part {
                Part::Text(t) => text.push_str(t),
                Part::Placeholder(field) => {
                    fields.push(field.clone());
                    text.push_str(&mark(fields.len()));
                }
            }
        }
        (text, fields)
    }
}

/// The value at `root` and `steps` in `output`.
fn lookup<'o>(output: &'o Map<String, Value>, root: &str, steps: &[Step]) -> Option<Cow<'o, Value>> {
    let mut value = Cow::Borrowed(output.get(root)?);
    for s in steps {
        if let Value::String(json) = &*value {
            value = Cow::Owned(serde_json::from_str(json).ok()?);
        }
        value = match value {
            Cow::Borrowed(v) => Cow::Borrowed(step(v, s)?),
            Cow::Owned(v) => Cow::Owned(step(&v, s)?.clone()),
        };
    }
    Some(value)
}

/// The root name and steps of a placeholder's body, `payload.list[1].temp`.
fn placeholder(body: &str) -> Result<(String, Vec<Step>), String> {
    let mut root = None;
    let mut steps = Vec::new();
    for segment in body.split('.') {
        let (name, mut indexes) = segment.split_at(segment.find('[').unwrap_or(segment.len()));
        if name.is_empty() || name.contains([']', '$', '{']) || name.trim() != name {
            return Err(format!("expected a name, found `{name}`"));
        }
        match root {
            None => root = Some(name.to_owned()),
            Some(_) => steps.push(Step::Key(name.to_owned())),
        }
        while let Some(inner) = indexes.strip_prefix('[') {
            let close = inner.find(']').ok_or("unclosed `[`")?;
            let n = inner[..close].parse::<i64>().ok().filter(|n| *n != 0);
            steps.push(Step::Index(
                n.ok_or_else(|| format!("`[{}]` is not an index (1 is the first)", &inner[..close]))?,
            ));
            indexes = &inner[close + 1..];
        }
        if !indexes.is_empty() {
            return Err(format!("unexpected `{indexes}`"));
        }
    }
    Ok((root.unwrap_or_default(), steps))
}

/// The line and column of the byte offset `at` in `text`.
fn position(text: &str, at: usize) -> Position {
    let before = &text[..at];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().unwrap_or_default().chars().count() + 1;
    Position { line: line as u64, column: column as u64 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn output(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap()
    }

    #[test]
    fn placeholders_are_filled_from_the_output() {
        let out = output(json!({
            "clientid": "dev1",
            "temp": 31.5,
            "payload": {"temp": 31.5, "list": [1, {"x": "y"}]},
            "flag": true,
            "gone": null,
        }));
        let render = |t: &str| Template::parse(t).unwrap().render(&out);
        assert_eq!(render("republish:alerts/${clientid}"), "republish:alerts/dev1");
        assert_eq!(render("${temp}°C from ${clientid}"), "31.5°C from dev1");
        assert_eq!(render("${payload.temp}"), "31.5");
        assert_eq!(render("${payload.list[2].x} ${payload.list[-2]}"), "y 1");
        assert_eq!(render("${payload.list}"), r#"[1,{"x":"y"}]"#);
        assert_eq!(render("[${gone}${missing}${payload.nope}] ${flag}"), "[] true");
        assert_eq!(render("cost: $5 ${clientid}$"), "cost: $5 dev1$");
        assert_eq!(render("no placeholders"), "no placeholders");
        assert_eq!(render(""), "");
    }

    #[test]
    fn a_json_string_is_read_into() {
        let out = output(json!({"payload": "{\"temp\": 22, \"a\": {\"b\": [5]}}", "text": "plain"}));
        assert_eq!(Template::parse("${payload.temp}/${payload.a.b[1]}").unwrap().render(&out), "22/5");
        assert_eq!(
            Template::parse("${payload}").unwrap().render(&out),
            "{\"temp\": 22, \"a\": {\"b\": [5]}}"
        );
        assert_eq!(Template::parse("<${text.x}>").unwrap().render(&out), "<>");
    }

    #[test]
    fn parameters_take_the_placeholders_out_of_the_text() {
        let t = Template::parse("INSERT INTO t(a, b) VALUES (${clientid}, ${payload.temp})").unwrap();
        let (sql, fields) = t.parameters(|n| format!("${n}"));
        assert_eq!(sql, "INSERT INTO t(a, b) VALUES ($1, $2)");
        let out = output(json!({"clientid": "d'1", "payload": "{\"temp\": 22.5}"}));
        let values: Vec<_> = fields.iter().map(|f| f.value(&out).map(|v| v.into_owned())).collect();
        assert_eq!(values, [Some(json!("d'1")), Some(json!(22.5))]);
    }

    #[test]
    fn malformed_templates_are_refused_with_a_position() {
        let err = |t: &str| Template::parse(t).unwrap_err().to_string();
        assert_eq!(err("alerts/${clientid"), "line 1, column 8: unclosed `${`: expected `}`");
        assert_eq!(err("a ${}"), "line 1, column 3: in `${}`: expected a name, found ``");
        assert_eq!(err("x\n  ${a..b}"), "line 2, column 3: in `${a..b}`: expected a name, found ``");
        assert!(err("${list[x]}").contains("`[x]` is not an index"));
        assert!(err("${list[0]}").contains("`[0]` is not an index"));
        assert!(err("${list[1}").contains("unclosed `[`"));
        assert!(err("${list[1]x}").contains("unexpected `x`"));
    }
}
