//! Consul's `filter` query parameter on the Consul-compatible port: the subset of Consul's
//! filter language (HashiCorp go-bexpr, "Filtering" in Consul's API docs) that Prometheus and
//! consul-template users write.
//!
//! Grammar (keywords are case-sensitive, as in go-bexpr):
//!
//! ```text
//! expr     = or
//! or       = and { "or" and }
//! and      = unary { "and" unary }
//! unary    = "not" unary | "(" expr ")" | match
//! match    = selector ( "==" | "!=" ) value
//!          | selector [ "not" ] "contains" value
//!          | value [ "not" ] "in" selector
//!          | selector "is" [ "not" ] "empty"
//! selector = ident { "." ident }          e.g. Service.Tags, ServiceTags, Node.Node
//! value    = "double-quoted" | `backquoted` | bare word (digits, letters, - _ . / :)
//! ```
//!
//! A selector is a path into the JSON object the route returns for one instance (so
//! `/v1/health/service` takes `Service.Tags`, `Service.Port`, `Node.Node`, `Checks`...;
//! `/v1/catalog/service` takes `ServiceTags`, `ServicePort`, `Node`...). A selector naming no
//! field of that shape is refused before anything is evaluated, like Consul's "Selector ... is
//! not valid". `==` on a number field compares the number; `contains` / `in` work on a list (an
//! element equal to the value) and on a string (a substring). Errors become Consul's 400
//! `Failed to create boolean expression evaluator: ...`.

use serde_json::Value;

/// Longest filter accepted, bytes (Consul has no documented limit; bounded anyway).
pub const MAX_FILTER_BYTES: usize = 4_096;
/// Deepest nesting of `not` / parentheses accepted.
pub const MAX_DEPTH: usize = 32;

/// A parsed filter expression.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Filter {
    /// Both hold.
    And(Box<Filter>, Box<Filter>),
    /// Either holds.
    Or(Box<Filter>, Box<Filter>),
    /// Does not hold.
    Not(Box<Filter>),
    /// One comparison.
    Match {
        /// Dotted path into the instance's JSON.
        selector: Vec<String>,
        /// The comparison.
        op: Op,
        /// The literal compared with (empty for `is empty`).
        value: String,
    },
}

/// A comparison of a [`Filter::Match`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `==`.
    Equal,
    /// `!=`.
    NotEqual,
    /// `contains` / `in`.
    Contains,
    /// `not contains` / `not in`.
    NotContains,
    /// `is empty`.
    Empty,
    /// `is not empty`.
    NotEmpty,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    Word(String),
    Quoted(String),
    Eq,
    Ne,
    Open,
    Close,
}

fn lex(s: &str) -> Result<Vec<Tok>, String> {
    let mut out = Vec::new();
    let b: Vec<char> = s.chars().collect();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        match c {
            ' ' | '\t' | '\n' | '\r' => i += 1,
            '(' => {
                out.push(Tok::Open);
                i += 1;
            }
            ')' => {
                out.push(Tok::Close);
                i += 1;
            }
            '=' | '!' if b.get(i + 1) == Some(&'=') => {
                out.push(if c == '=' { Tok::Eq } else { Tok::Ne });
                i += 2;
            }
            '"' | '`' => {
                let mut v = String::new();
                i += 1;
                loop {
                    match b.get(i) {
                        None => return Err(format!("1:{}: unterminated string", i + 1)),
                        Some(&q) if q == c => break,
                        Some('\\') if c == '"' => {
                            let next = b.get(i + 1).ok_or("unterminated escape")?;
                            v.push(*next);
                            i += 2;
                            continue;
                        }
                        Some(&ch) => v.push(ch),
                    }
                    i += 1;
                }
                i += 1;
                out.push(Tok::Quoted(v));
            }
            c if c.is_alphanumeric() || "-_./:".contains(c) => {
                let start = i;
                while i < b.len() && (b[i].is_alphanumeric() || "-_./:".contains(b[i])) {
                    i += 1;
                }
                out.push(Tok::Word(b[start..i].iter().collect()));
            }
            other => return Err(format!("1:{}: unexpected character {other:?}", i + 1)),
        }
    }
    Ok(out)
}

struct Parser {
    toks: Vec<Tok>,
    pos: usize,
    depth: usize,
}

impl Parser {
    fn peek_word(&self, w: &str) -> bool {
        matches!(self.toks.get(self.pos), Some(Tok::Word(x)) if x == w)
    }

    fn eat_word(&mut self, w: &str) -> bool {
        let hit = self.peek_word(w);
        if hit {
            self.pos += 1;
        }
        hit
    }

    fn next(&mut self) -> Option<Tok> {
        let t = self.toks.get(self.pos).cloned();
        self.pos += 1;
        t
    }

    fn or(&mut self) -> Result<Filter, String> {
        let mut left = self.and()?;
        while self.eat_word("or") {
            left = Filter::Or(Box::new(left), Box::new(self.and()?));
        }
        Ok(left)
    }

    fn and(&mut self) -> Result<Filter, String> {
        let mut left = self.unary()?;
        while self.eat_word("and") {
            left = Filter::And(Box::new(left), Box::new(self.unary()?));
        }
        Ok(left)
    }

    fn unary(&mut self) -> Result<Filter, String> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(format!("nested deeper than {MAX_DEPTH}"));
        }
        let out = if self.eat_word("not") {
            Filter::Not(Box::new(self.unary()?))
        } else if self.toks.get(self.pos) == Some(&Tok::Open) {
            self.pos += 1;
            let inner = self.or()?;
            if self.next() != Some(Tok::Close) {
                return Err("expected \")\"".into());
            }
            inner
        } else {
            self.matcher()?
        };
        self.depth -= 1;
        Ok(out)
    }

    fn value(&mut self) -> Result<String, String> {
        match self.next() {
            Some(Tok::Quoted(v)) | Some(Tok::Word(v)) => Ok(v),
            other => Err(format!("expected a value, found {other:?}")),
        }
    }

    fn matcher(&mut self) -> Result<Filter, String> {
        let first = self.next();
        // `"value" [not] in Selector`.
        let in_form = |p: &Parser| {
            p.peek_word("in")
                || (p.peek_word("not")
                    && matches!(p.toks.get(p.pos + 1), Some(Tok::Word(w)) if w == "in"))
        };
        if let Some(Tok::Quoted(v)) | Some(Tok::Word(v)) = &first {
            if in_form(self) {
                let negated = self.eat_word("not");
                self.eat_word("in");
                let sel = match self.next() {
                    Some(Tok::Word(s)) => selector(&s)?,
                    other => {
                        return Err(format!("expected a selector after \"in\", found {other:?}"))
                    }
                };
                let op = if negated {
                    Op::NotContains
                } else {
                    Op::Contains
                };
                return Ok(Filter::Match {
                    selector: sel,
                    op,
                    value: v.clone(),
                });
            }
        }
        let sel = match first {
            Some(Tok::Word(s)) => selector(&s)?,
            other => return Err(format!("expected a selector, found {other:?}")),
        };
        let (op, value) = match self.next() {
            Some(Tok::Eq) => (Op::Equal, self.value()?),
            Some(Tok::Ne) => (Op::NotEqual, self.value()?),
            Some(Tok::Word(w)) if w == "contains" => (Op::Contains, self.value()?),
            Some(Tok::Word(w)) if w == "not" && self.eat_word("contains") => {
                (Op::NotContains, self.value()?)
            }
            Some(Tok::Word(w)) if w == "is" => {
                let negated = self.eat_word("not");
                if !self.eat_word("empty") {
                    return Err("expected \"empty\" after \"is\"".into());
                }
                (
                    if negated { Op::NotEmpty } else { Op::Empty },
                    String::new(),
                )
            }
            other => {
                return Err(format!(
                    "expected ==, !=, contains, not contains or is [not] empty, found {other:?}"
                ))
            }
        };
        Ok(Filter::Match {
            selector: sel,
            op,
            value,
        })
    }
}

fn selector(s: &str) -> Result<Vec<String>, String> {
    let parts: Vec<String> = s.split('.').map(str::to_owned).collect();
    let ok = parts.iter().all(|p| {
        p.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
            && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    });
    if ok {
        Ok(parts)
    } else {
        Err(format!("invalid selector {s:?}"))
    }
}

impl Filter {
    /// Parses a filter expression.
    ///
    /// # Errors
    /// A message in the style of Consul's (the caller answers 400 with it).
    pub fn parse(s: &str) -> Result<Self, String> {
        if s.len() > MAX_FILTER_BYTES {
            return Err(format!("filter longer than {MAX_FILTER_BYTES} bytes"));
        }
        let toks = lex(s)?;
        if toks.is_empty() {
            return Err("empty filter".into());
        }
        let mut p = Parser {
            toks,
            pos: 0,
            depth: 0,
        };
        let f = p.or()?;
        if p.pos < p.toks.len() {
            return Err(format!(
                "unexpected {:?} after the expression",
                p.toks[p.pos]
            ));
        }
        Ok(f)
    }

    /// Checks every selector against the JSON shape of one element of the route's answer
    /// ([`health_shape`], [`catalog_shape`]): a selector that names no field of it is refused.
    ///
    /// # Errors
    /// `Selector "X" is not valid`, as Consul says.
    pub fn check_selectors(&self, shape: &Value) -> Result<(), String> {
        match self {
            Filter::And(a, b) | Filter::Or(a, b) => {
                a.check_selectors(shape)?;
                b.check_selectors(shape)
            }
            Filter::Not(a) => a.check_selectors(shape),
            Filter::Match { selector, .. } => {
                if valid(shape, selector) {
                    Ok(())
                } else {
                    Err(format!("Selector {:?} is not valid", selector.join(".")))
                }
            }
        }
    }

    /// True when `item` (one element of the route's answer) passes.
    pub fn matches(&self, item: &Value) -> bool {
        match self {
            Filter::And(a, b) => a.matches(item) && b.matches(item),
            Filter::Or(a, b) => a.matches(item) || b.matches(item),
            Filter::Not(a) => !a.matches(item),
            Filter::Match {
                selector,
                op,
                value,
            } => {
                // A selector through a list (`Checks.Status`) holds for any of its elements.
                let mut fields = Vec::new();
                lookup(item, selector, &mut fields);
                let any = |f: &dyn Fn(&Value) -> bool| fields.iter().any(|v| f(v));
                match op {
                    Op::Equal => any(&|v| equal(v, value)),
                    Op::NotEqual => !any(&|v| equal(v, value)),
                    Op::Contains => any(&|v| contains(v, value)),
                    Op::NotContains => !any(&|v| contains(v, value)),
                    Op::Empty => fields.is_empty() || fields.iter().all(|v| empty(v)),
                    Op::NotEmpty => !(fields.is_empty() || fields.iter().all(|v| empty(v))),
                }
            }
        }
    }
}

/// The values at `path` in `v`; a list on the way is walked element by element.
fn lookup<'a>(v: &'a Value, path: &[String], out: &mut Vec<&'a Value>) {
    match (v, path.split_first()) {
        (_, None) => out.push(v),
        (Value::Array(items), Some(_)) => {
            for i in items {
                lookup(i, path, out);
            }
        }
        (Value::Object(m), Some((k, rest))) => {
            if let Some(next) = m.get(k) {
                lookup(next, rest, out);
            }
        }
        _ => {}
    }
}

/// True when `path` names a field of `shape` (a `"*"` key stands for a map's free keys).
fn valid(shape: &Value, path: &[String]) -> bool {
    match (shape, path.split_first()) {
        (_, None) => true,
        (Value::Array(items), Some(_)) => items.first().is_some_and(|i| valid(i, path)),
        (Value::Object(m), Some((k, rest))) => match m.get(k) {
            Some(next) => valid(next, rest),
            None => m.contains_key("*"),
        },
        _ => false,
    }
}

/// A map with free keys in a shape.
fn free() -> Value {
    serde_json::json!({"*": ""})
}

/// The fields of one `/v1/health/service` element (`crate::consul_json::Instance::health_json`).
pub fn health_shape() -> Value {
    serde_json::json!({
        "Node": {"ID": "", "Node": "", "Address": "", "Datacenter": "", "TaggedAddresses": free(),
                 "Meta": free(), "CreateIndex": 0, "ModifyIndex": 0},
        "Service": {"ID": "", "Service": "", "Tags": [], "Address": "", "TaggedAddresses": free(),
                    "Meta": free(), "Port": 0, "Weights": {"Passing": 0, "Warning": 0},
                    "EnableTagOverride": false, "Proxy": free(), "Connect": free(),
                    "CreateIndex": 0, "ModifyIndex": 0},
        "Checks": [{"Node": "", "CheckID": "", "Name": "", "Status": "", "Notes": "", "Output": "",
                    "ServiceID": "", "ServiceName": "", "ServiceTags": [], "Type": "",
                    "Definition": free(), "CreateIndex": 0, "ModifyIndex": 0}],
    })
}

/// The fields of one `/v1/catalog/service` element (`crate::consul_json::Instance::catalog_json`).
pub fn catalog_shape() -> Value {
    serde_json::json!({
        "ID": "", "Node": "", "Address": "", "Datacenter": "", "TaggedAddresses": free(),
        "NodeMeta": free(), "ServiceKind": "", "ServiceID": "", "ServiceName": "",
        "ServiceTags": [], "ServiceAddress": "", "ServiceTaggedAddresses": free(),
        "ServiceWeights": {"Passing": 0, "Warning": 0}, "ServiceMeta": free(), "ServicePort": 0,
        "ServiceEnableTagOverride": false, "ServiceProxy": free(), "ServiceConnect": free(),
        "CreateIndex": 0, "ModifyIndex": 0,
    })
}

fn equal(field: &Value, value: &str) -> bool {
    match field {
        Value::String(s) => s == value,
        Value::Number(n) => value.parse::<f64>().ok() == n.as_f64(),
        Value::Bool(b) => value.parse::<bool>().ok() == Some(*b),
        _ => false,
    }
}

fn contains(field: &Value, value: &str) -> bool {
    match field {
        Value::Array(items) => items.iter().any(|i| equal(i, value)),
        Value::String(s) => s.contains(value),
        Value::Object(m) => m.contains_key(value),
        _ => false,
    }
}

fn empty(field: &Value) -> bool {
    match field {
        Value::Null => true,
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(m) => m.is_empty(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn item() -> Value {
        json!({
            "Node": {"Node": "node-1", "Address": "127.0.0.1"},
            "Service": {"ID": "web-1", "Service": "web.http.prod", "Tags": ["zone=z1", "version=v2"], "Port": 8080, "Meta": {}},
            "Checks": [{"CheckID": "serfHealth", "Status": "passing"}, {"CheckID": "shoal:web-1", "Status": "critical"}],
        })
    }

    fn eval(f: &str) -> bool {
        let f = Filter::parse(f).unwrap();
        f.check_selectors(&health_shape()).unwrap();
        f.matches(&item())
    }

    #[test]
    fn what_prometheus_and_consul_template_users_write() {
        assert!(eval(r#"Service.Tags contains "zone=z1""#));
        assert!(!eval(r#"Service.Tags contains "zone=z2""#));
        assert!(eval(r#""version=v2" in Service.Tags"#));
        assert!(eval(r#""zone=z9" not in Service.Tags"#));
        assert!(eval(r#"Service.Tags not contains "x""#));
        assert!(eval(r#"Service.Service == "web.http.prod""#));
        assert!(eval(r#"Service.ID != "web-2""#));
        assert!(eval("Service.Port == 8080"));
        assert!(eval(r#"Node.Node == `node-1` and Service.Port != 80"#));
        assert!(eval(
            r#"Service.ID == "x" or Service.Tags contains "zone=z1""#
        ));
        assert!(eval(r#"not (Service.ID == "x" or Service.ID == "y")"#));
        assert!(eval(r#"not Service.ID == "x" and Service.Meta is empty"#));
        assert!(eval("Service.Meta is empty and Service.Tags is not empty"));
        assert!(eval(r#"Checks.Status == "critical""#), "any check");
        assert!(!eval(r#"Checks.Status != "critical""#));
        assert!(
            eval(r#"Service.Meta.team is empty"#),
            "free map keys are valid selectors"
        );
        // and binds tighter than or.
        assert!(eval(
            r#"Service.ID == "web-1" or Service.ID == "x" and Service.ID == "y""#
        ));
    }

    #[test]
    fn bad_filters_are_refused_with_a_reason() {
        for bad in [
            "",
            "Service.Tags contains",
            r#"Service.Tags contains "x"#,
            r#"Service.Tags === "x""#,
            r#"(Service.ID == "x""#,
            r#"Service.ID == "x" Service.ID == "y""#,
            r#"Service.ID ~= "x""#,
            r#"Service.ID is full"#,
            r#"1Service == "x""#,
        ] {
            assert!(Filter::parse(bad).is_err(), "{bad:?} parsed");
        }
        let deep = format!("{}Service.ID == \"x\"{}", "(".repeat(40), ")".repeat(40));
        assert!(Filter::parse(&deep).is_err(), "depth is bounded");
        let unknown = Filter::parse(r#"Service.Nope == "x""#).unwrap();
        assert_eq!(
            unknown.check_selectors(&health_shape()).unwrap_err(),
            r#"Selector "Service.Nope" is not valid"#
        );
        let flat = Filter::parse(r#"ServiceTags contains "a""#).unwrap();
        assert!(flat.check_selectors(&catalog_shape()).is_ok());
        assert!(
            flat.check_selectors(&health_shape()).is_err(),
            "catalog selector on health"
        );
    }
}
