//! Named cloud prompts, from a TOML file:
//!
//! ```toml
//! [[prompt]]
//! id = "acme-support"
//! system = "You are the support assistant of Acme Rail. ..."
//!
//! # a base model (no chat template): the prompt as plain text, BOS added if the model wants it
//! [[prompt]]
//! id = "manual"
//! text = "The Acme Rail handbook. ..."
//! ```

use serde::Deserialize;

use crate::CloudError;

#[derive(Debug, Clone, Deserialize)]
pub struct PromptSpec {
    pub id: String,
    /// The system message; it is rendered with the model's chat template as the system turn
    /// (a model without one reads it as plain text).
    #[serde(default)]
    pub system: String,
    /// Or the prompt as plain text, never templated.
    #[serde(default)]
    pub text: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct PromptsFile {
    #[serde(rename = "prompt")]
    pub prompts: Vec<PromptSpec>,
}

impl PromptsFile {
    pub fn load(path: &std::path::Path) -> Result<Self, CloudError> {
        let err = |msg: String| CloudError::Prompts {
            path: path.display().to_string(),
            msg,
        };
        let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
        let f: Self = toml::from_str(&text).map_err(|e| err(e.to_string()))?;
        for p in &f.prompts {
            if !edgeprompt_protocol::valid_prompt_id(&p.id) {
                return Err(err(format!("invalid prompt id {:?}", p.id)));
            }
        }
        Ok(f)
    }
}
