//! `edgeprompt generate`: one chat turn on one node.

use std::io::Write;

use anyhow::Context;
use edgeprompt_engine::{GenerateOptions, Generator, Message, SamplingParams, Sequence};

#[derive(clap::Args)]
pub struct Args {
    /// Model name (smollm2, qwen05, qwen15) or GGUF path.
    #[arg(long, default_value = "smollm2")]
    model: String,
    /// System message (the part EdgePrompt would take from the cloud).
    #[arg(long, default_value = "You are a helpful assistant.")]
    system: String,
    /// The user's message.
    #[arg(long)]
    prompt: String,
    #[arg(long, default_value_t = 128)]
    max_tokens: usize,
    /// 0 = greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Stop strings (repeatable).
    #[arg(long)]
    stop: Vec<String>,
    /// Print the rendered prompt and its token count first.
    #[arg(long)]
    show_prompt: bool,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let model = super::models::load(&a.model)?;
    let chat = model
        .chat
        .as_ref()
        .context("the model has no chat template")?;
    let text = chat.render(
        &[
            Message::new("system", &a.system),
            Message::new("user", &a.prompt),
        ],
        true,
    )?;
    let ids = model.tokenizer.encode(&text)?;
    if a.show_prompt {
        eprintln!("--- prompt ({} tokens) ---\n{text}\n---", ids.len());
    }
    let opts = GenerateOptions {
        max_tokens: a.max_tokens,
        sampling: SamplingParams {
            temperature: a.temperature,
            top_k: a.top_k,
            top_p: a.top_p,
            seed: a.seed,
        },
        stop: a.stop,
        ..Default::default()
    };
    let mut seq = Sequence::new(&model);
    let mut out = std::io::stdout();
    let stats = Generator::new(&model).run(&mut seq, &ids, &opts, |t| {
        let _ = out.write_all(t.as_bytes());
        let _ = out.flush();
    })?;
    println!();
    eprintln!(
        "TTFT {:.3} s | prefill {} tok at {:.1} tok/s | decode {} tok at {:.1} tok/s | finish: {}",
        stats.ttft_secs,
        stats.prompt_tokens,
        stats.prefill_tok_s(),
        stats.completion_tokens,
        stats.decode_tok_s(),
        stats.finish_reason
    );
    Ok(())
}
