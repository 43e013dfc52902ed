//! Tool calling in the Hermes form Qwen2.5's template teaches the model: calls are
//! `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`. The calls are constrained to
//! the declared functions' schemas, then read back out of the answer, whole or streamed.

use serde_json::{json, Value};

use edgeprompt_engine::Spec;

use super::request::{FunctionCall, Tool, ToolCall, ToolChoice};

pub const OPEN: &str = "<tool_call>";
pub const CLOSE: &str = "</tool_call>";

/// Most functions one request may declare.
const MAX_TOOLS: usize = 128;

/// How a request's tools shape its answer.
pub struct ToolPlan {
    /// The functions as the template renders them (`None`: none rendered).
    pub rendered: Option<Value>,
    /// The grammar of the answer: calls, or (`auto`) calls or text.
    pub grammar: Option<Spec>,
    /// The functions' names, when calls are read out of the answer.
    pub parse: Option<Vec<String>>,
}

impl ToolPlan {
    pub const NONE: ToolPlan = ToolPlan {
        rendered: None,
        grammar: None,
        parse: None,
    };
}

/// The plan for `tools` and `tool_choice` (OpenAI's defaults: `auto` with tools, `none`
/// without); errors are the client's.
pub fn plan(
    tools: Option<&[Tool]>,
    choice: Option<&ToolChoice>,
    parallel: bool,
) -> Result<ToolPlan, String> {
    let tools = tools.unwrap_or_default();
    if tools.len() > MAX_TOOLS {
        return Err(format!("at most {MAX_TOOLS} tools may be given"));
    }
    let mut names = std::collections::HashSet::new();
    for t in tools {
        if t.kind != "function" {
            return Err(format!("tools of type {:?} are not supported", t.kind));
        }
        let n = &t.function.name;
        if n.is_empty()
            || n.len() > 64
            || !n.chars().all(|c| c.is_alphanumeric() || "_-.".contains(c))
        {
            return Err(format!(
                "tool name {n:?}: 1-64 letters, digits, '_', '-' or '.'"
            ));
        }
        if !names.insert(n.as_str()) {
            return Err(format!("tool {n:?} is declared twice"));
        }
        if let Some(p) = &t.function.parameters {
            if !p.is_object() {
                return Err(format!(
                    "tool {n:?}: parameters must be a JSON schema object"
                ));
            }
        }
    }
    let names = Some(tools.iter().map(|t| t.function.name.clone()).collect());
    let mode = match choice {
        None if tools.is_empty() => "none",
        None => "auto",
        Some(ToolChoice::Mode(m)) => m.as_str(),
        Some(ToolChoice::Named(n)) => {
            if n.kind != "function" {
                return Err(format!("tool_choice of type {:?} is not supported", n.kind));
            }
            let Some(t) = tools.iter().find(|t| t.function.name == n.function.name) else {
                return Err(format!(
                    "tool_choice names {:?}, which is not among the tools",
                    n.function.name
                ));
            };
            return Ok(ToolPlan {
                rendered: Some(json!(tools)),
                grammar: Some(calls_grammar(std::slice::from_ref(t), false, false)),
                parse: names,
            });
        }
    };
    match mode {
        "none" => Ok(ToolPlan::NONE),
        "auto" | "required" if tools.is_empty() => Err(format!("tool_choice {mode:?} needs tools")),
        "auto" => Ok(ToolPlan {
            rendered: Some(json!(tools)),
            grammar: Some(calls_grammar(tools, parallel, true)),
            parse: names,
        }),
        "required" => Ok(ToolPlan {
            rendered: Some(json!(tools)),
            grammar: Some(calls_grammar(tools, parallel, false)),
            parse: names,
        }),
        other => Err(format!(
            "tool_choice {other:?}: use \"none\", \"auto\", \"required\" or a named function"
        )),
    }
}

/// Lark for one or more calls to `tools`, or (`or_text`) for text instead. Text may not
/// open with `{`, a code fence or `<tool_call>`: a call is written only in the form that is
/// held to the functions' schemas (small models otherwise write bare or fenced JSON calls).
fn calls_grammar(tools: &[Tool], many: bool, or_text: bool) -> Spec {
    let one_of: Vec<Value> = tools
        .iter()
        .map(|t| {
            json!({
                "type": "object",
                "properties": {
                    "name": {"const": t.function.name},
                    "arguments": t.function.parameters.clone().unwrap_or_else(|| json!({"type": "object"})),
                },
                "required": ["name", "arguments"],
                "additionalProperties": false,
            })
        })
        .collect();
    let schema = edgeprompt_engine::bounded_whitespace(json!({"anyOf": one_of}));
    let more = if many {
        format!(" (\"\\n\" {OPEN:?} call)*")
    } else {
        String::new()
    };
    let start = if or_text { "calls | TEXT" } else { "calls" };
    Spec::Lark(format!(
        "start: {start}\n\
         calls: {OPEN:?} call{more}\n\
         call: \"\\n\" %json {schema} \"\\n\" {CLOSE:?}\n\
         TEXT: /(.|\\n)+/ & ~/[ \\t\\n]*(\\{{|```|<tool_call>)(.|\\n)*/\n"
    ))
}

fn call_id() -> String {
    format!("call_{:016x}", rand::random::<u64>())
}

/// One call's JSON as the model wrote it, as OpenAI's `tool_calls` entry.
fn read_call(body: &str) -> Option<ToolCall> {
    let v: Value = serde_json::from_str(body.trim()).ok()?;
    let name = v.get("name")?.as_str()?.to_string();
    let arguments = match v.get("arguments") {
        Some(Value::String(s)) => s.clone(),
        Some(a) => a.to_string(),
        None => "{}".into(),
    };
    Some(ToolCall {
        id: Some(call_id()),
        kind: "function".into(),
        function: FunctionCall { name, arguments },
    })
}

/// A whole answer that is one call's JSON without its `<tool_call>` tags (small models write
/// that), naming one of `names`.
fn bare_call(text: &str, names: &[String]) -> Option<ToolCall> {
    let t = text.trim();
    if !t.starts_with('{') {
        return None;
    }
    read_call(t).filter(|c| names.contains(&c.function.name))
}

/// A whole answer split into its text and its calls; text that does not read as calls stays
/// text.
pub fn split_calls(text: &str, names: &[String]) -> (Option<String>, Vec<ToolCall>) {
    let whole = || (Some(text.to_string()), Vec::new());
    let Some(at) = text.find(OPEN) else {
        return match bare_call(text, names) {
            Some(c) => (None, vec![c]),
            None => whole(),
        };
    };
    let mut calls = Vec::new();
    let mut rest = &text[at..];
    while let Some(r) = rest.trim_start().strip_prefix(OPEN) {
        let (body, after) = match r.find(CLOSE) {
            Some(end) => (&r[..end], &r[end + CLOSE.len()..]),
            None => (r, ""),
        };
        match read_call(body) {
            Some(c) => calls.push(c),
            None => return whole(),
        }
        rest = after;
    }
    if !rest.trim().is_empty() {
        return whole();
    }
    let content = text[..at].trim_end();
    ((!content.is_empty()).then(|| content.to_string()), calls)
}

/// What a streamed answer's text becomes, piece by piece.
#[derive(Debug)]
pub enum Streamed {
    Content(String),
    Call(ToolCall),
}

/// Reads calls out of an answer as its text arrives: text before the first call streams as
/// content (held back only while it might be the start of `<tool_call>`), each call goes out
/// whole once closed. An answer that opens with `{` is held to its end: it may be a bare call.
#[derive(Default)]
pub struct CallStream {
    names: Vec<String>,
    buf: String,
    in_calls: bool,
    started: bool,
    bare: bool,
}

impl CallStream {
    pub fn new(names: Vec<String>) -> Self {
        Self {
            names,
            ..Self::default()
        }
    }

    pub fn push(&mut self, text: &str) -> Vec<Streamed> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        if !self.started {
            match self.buf.trim_start().chars().next() {
                None => return out,
                Some(c) => {
                    self.started = true;
                    self.bare = c == '{';
                }
            }
        }
        if self.bare {
            return out;
        }
        if !self.in_calls {
            match self.buf.find(OPEN) {
                Some(at) => {
                    let before = self.buf[..at].trim_end().to_string();
                    if !before.is_empty() {
                        out.push(Streamed::Content(before));
                    }
                    self.buf.drain(..at);
                    self.in_calls = true;
                }
                None => {
                    // Keep back trailing space and anything that could begin `<tool_call>`.
                    let keep = held_back(&self.buf);
                    let send: String = self.buf.drain(..self.buf.len() - keep).collect();
                    if !send.is_empty() {
                        out.push(Streamed::Content(send));
                    }
                    return out;
                }
            }
        }
        // In the calls: each is `<tool_call>` (after a line break), a body, `</tool_call>`.
        loop {
            let t = self.buf.trim_start();
            if t.is_empty() || OPEN.starts_with(t) {
                return out;
            }
            let Some(r) = t.strip_prefix(OPEN) else {
                // Text after the calls is text again.
                self.in_calls = false;
                out.extend(self.push(""));
                return out;
            };
            let Some(end) = r.find(CLOSE) else {
                return out;
            };
            let body = &r[..end];
            out.push(match read_call(body) {
                Some(c) => Streamed::Call(c),
                None => Streamed::Content(format!("{OPEN}{body}{CLOSE}")),
            });
            self.buf = r[end + CLOSE.len()..].to_string();
        }
    }

    /// The answer ended: what is left, as content.
    pub fn finish(&mut self) -> Vec<Streamed> {
        let rest = std::mem::take(&mut self.buf);
        if self.bare {
            self.bare = false;
            if let Some(c) = bare_call(&rest, &self.names) {
                return vec![Streamed::Call(c)];
            }
            self.started = true;
            let mut out = self.push(&rest);
            out.extend(self.finish());
            return out;
        }
        if rest.trim().is_empty() {
            Vec::new()
        } else {
            vec![Streamed::Content(rest)]
        }
    }
}

/// Bytes at the end of `buf` to hold back: trailing whitespace and a partial `<tool_call>`.
fn held_back(buf: &str) -> usize {
    let partial = (1..OPEN.len())
        .rev()
        .find(|&k| buf.ends_with(&OPEN[..k]))
        .unwrap_or(0);
    let body = &buf[..buf.len() - partial];
    partial + (body.len() - body.trim_end().len())
}

/// The calls of an assistant turn as the template renders them: `arguments` as an object.
pub fn rendered_calls(calls: &[ToolCall]) -> Value {
    calls
        .iter()
        .map(|c| {
            let args = serde_json::from_str::<Value>(&c.function.arguments)
                .unwrap_or_else(|_| Value::String(c.function.arguments.clone()));
            json!({
                "id": c.id,
                "type": c.kind,
                "function": {"name": c.function.name, "arguments": args},
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const CALL: &str = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";

    #[test]
    fn whole_answers_split_into_text_and_calls() {
        let names = ["get_weather".to_string()];
        let (c, calls) = split_calls(&format!("Let me look.\n{CALL}\n{CALL}"), &names);
        assert_eq!(c.as_deref(), Some("Let me look."));
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].function.name, "get_weather");
        assert_eq!(calls[0].function.arguments, r#"{"city":"Oslo"}"#);
        assert_ne!(calls[0].id, calls[1].id);
        let (c, calls) = split_calls("no calls <tool here", &names);
        assert_eq!(
            (c.as_deref(), calls.len()),
            (Some("no calls <tool here"), 0)
        );
        // A call that does not read as JSON leaves the answer as text.
        let bad = "<tool_call>\n{not json}\n</tool_call>";
        assert_eq!(split_calls(bad, &names).0.as_deref(), Some(bad));
        // A bare call names a declared function; other JSON stays text.
        let bare = r#"{"name": "get_weather", "arguments": {"city": "Oslo"}}"#;
        let (c, calls) = split_calls(bare, &names);
        assert_eq!((c, calls.len()), (None, 1));
        let other = r#"{"name": "Ada", "arguments": {}}"#;
        assert_eq!(split_calls(other, &names).0.as_deref(), Some(other));
    }

    #[test]
    fn streamed_answers_give_the_same_calls_in_any_cut() {
        let text = format!("Sure.  {CALL}\n{CALL}");
        let names = vec!["get_weather".to_string()];
        for step in [1, 2, 3, 7, 1000] {
            let mut s = CallStream::new(names.clone());
            let mut out = Vec::new();
            let chars: Vec<char> = text.chars().collect();
            for piece in chars.chunks(step) {
                out.extend(s.push(&piece.iter().collect::<String>()));
            }
            out.extend(s.finish());
            let content: String = out
                .iter()
                .filter_map(|p| match p {
                    Streamed::Content(c) => Some(c.as_str()),
                    _ => None,
                })
                .collect();
            let calls: Vec<&ToolCall> = out
                .iter()
                .filter_map(|p| match p {
                    Streamed::Call(c) => Some(c),
                    _ => None,
                })
                .collect();
            assert_eq!(content, "Sure.", "step {step}");
            assert_eq!(calls.len(), 2, "step {step}");
            assert_eq!(calls[1].function.arguments, r#"{"city":"Oslo"}"#);
        }
        // A bare call, and JSON that is not one.
        for (text, call) in [
            (
                r#" {"name": "get_weather", "arguments": {"city": "Oslo"}}"#,
                true,
            ),
            (r#"{"colour": "red"}"#, false),
        ] {
            let mut s = CallStream::new(names.clone());
            let mut out = s.push(&text[..5]);
            assert!(out.is_empty(), "held back");
            out.extend(s.push(&text[5..]));
            out.extend(s.finish());
            match (&out[..], call) {
                ([Streamed::Call(c)], true) => assert_eq!(c.function.name, "get_weather"),
                ([Streamed::Content(t)], false) => assert_eq!(t, text),
                _ => panic!("{text}: {out:?}"),
            }
        }
        let mut s = CallStream::new(names);
        let mut out = s.push("a < b <tool");
        out.extend(s.push("s> c"));
        out.extend(s.finish());
        let text: String = out
            .into_iter()
            .map(|p| match p {
                Streamed::Content(c) => c,
                Streamed::Call(_) => panic!("no call"),
            })
            .collect();
        assert_eq!(text, "a < b <tools> c");
    }

    #[test]
    fn plans_follow_tool_choice() {
        let tools: Vec<Tool> = serde_json::from_value(json!([{
            "type": "function",
            "function": {"name": "get_weather", "parameters": {"type": "object",
                "properties": {"city": {"type": "string"}}, "required": ["city"]}}
        }]))
        .unwrap();
        let p = plan(Some(&tools), None, true).unwrap();
        assert!(
            matches!(p.grammar, Some(Spec::Lark(ref l)) if l.starts_with("start: calls | TEXT"))
        );
        let p = plan(Some(&tools), Some(&ToolChoice::Mode("none".into())), true).unwrap();
        assert!(p.rendered.is_none() && p.grammar.is_none());
        let p = plan(
            Some(&tools),
            Some(&ToolChoice::Mode("required".into())),
            true,
        )
        .unwrap();
        assert!(matches!(p.grammar, Some(Spec::Lark(ref l)) if l.starts_with("start: calls\n")));
        let named: ToolChoice =
            serde_json::from_value(json!({"type": "function", "function": {"name": "nope"}}))
                .unwrap();
        assert!(plan(Some(&tools), Some(&named), true).is_err());
        assert!(plan(None, Some(&ToolChoice::Mode("required".into())), true).is_err());
        assert!(plan(
            Some(&tools),
            Some(&ToolChoice::Mode("sometimes".into())),
            true
        )
        .is_err());
    }
}
