//! The model's own chat template (`tokenizer.chat_template` in the GGUF), rendered with
//! minijinja, and the cloud/edge split of a rendered conversation.

use minijinja::{context, Environment, Error as JinjaError, ErrorKind};
use serde::{Deserialize, Serialize};

use crate::{EngineError, Result};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Message {
    pub role: String,
    pub content: String,
    /// An assistant turn's calls, `[{"id", "type", "function": {"name", "arguments"}}]` with
    /// `arguments` an object, as templates render them (absent, not null, when none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<serde_json::Value>,
    /// A tool turn's answer to this call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl Message {
    pub fn new(role: &str, content: &str) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
            tool_calls: None,
            tool_call_id: None,
        }
    }
}

pub struct ChatTemplate {
    env: Environment<'static>,
    bos: String,
    eos: String,
    /// The template writes tool calls as `<tool_call>{json}</tool_call>` (Qwen2.5, Hermes).
    pub tool_calls: bool,
}

/// A conversation cut at a template boundary: `cloud` is the rendered system turn, `edge` the
/// rest. `cloud + edge` is exactly the rendering of the whole conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitPrompt {
    pub cloud: String,
    pub edge: String,
}

impl ChatTemplate {
    pub fn new(source: &str, bos: &str, eos: &str) -> Result<Self> {
        let mut env = Environment::new();
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> std::result::Result<String, JinjaError> {
                Err(JinjaError::new(ErrorKind::InvalidOperation, msg))
            },
        );
        env.add_template_owned("chat", source.to_string())
            .map_err(|e| EngineError::Template(e.to_string()))?;
        Ok(Self {
            env,
            bos: bos.into(),
            eos: eos.into(),
            tool_calls: source.contains("<tool_call>") && source.contains("tools"),
        })
    }

    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        self.render_tools(messages, add_generation_prompt, None)
    }

    /// Render with the functions a model may call (`[{"type": "function", "function": ...}]`).
    pub fn render_tools(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        tools: Option<&serde_json::Value>,
    ) -> Result<String> {
        let tmpl = self
            .env
            .get_template("chat")
            .map_err(|e| EngineError::Template(e.to_string()))?;
        tmpl.render(context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos,
            eos_token => self.eos,
            tools => tools,
        })
        .map_err(|e| EngineError::Template(e.to_string()))
    }

    /// Render `system` alone as the cloud part and the full conversation; the edge part is
    /// what follows. Errors if the template does not render the system turn as a prefix.
    pub fn split(&self, system: &str, private: &[Message]) -> Result<SplitPrompt> {
        self.split_tools(system, private, None)
    }

    /// `split` with tools, which templates render into the system turn.
    pub fn split_tools(
        &self,
        system: &str,
        private: &[Message],
        tools: Option<&serde_json::Value>,
    ) -> Result<SplitPrompt> {
        let sys = [Message::new("system", system)];
        let cloud = self.render_tools(&sys, false, tools)?;
        let mut all = sys.to_vec();
        all.extend_from_slice(private);
        let full = self.render_tools(&all, true, tools)?;
        match full.strip_prefix(&cloud) {
            Some(edge) => Ok(SplitPrompt {
                cloud,
                edge: edge.to_string(),
            }),
            None => Err(EngineError::Template(
                "the template does not render the system turn as a prefix of the conversation"
                    .into(),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'].strip() + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn chatml_split_is_a_prefix_cut() {
        let t = ChatTemplate::new(CHATML, "", "<|im_end|>").unwrap();
        let s = t
            .split("Be brief. ", &[Message::new("user", "hi")])
            .unwrap();
        assert_eq!(s.cloud, "<|im_start|>system\nBe brief.<|im_end|>\n");
        assert_eq!(
            s.edge,
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn raise_exception_is_an_error() {
        let t = ChatTemplate::new("{{ raise_exception('no') }}", "", "").unwrap();
        assert!(t.render(&[], false).is_err());
    }
}
