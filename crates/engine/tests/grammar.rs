//! Constrained decoding on real models: the vocabulary's bytes against the tokenizer, and
//! answers that match their grammar.

mod common;

use edgeprompt_engine::{GrammarError, Grammars, Model, Sampler, SamplingParams, Sequence, Spec};
use serde_json::{json, Value};

/// Every model's token bytes spell what the tokenizer decodes (the reference).
#[test]
fn token_bytes_spell_the_decoded_text() {
    let text = "Héllo wörld, 123  spaces\n\tand \u{1F600} emoji; <|im_end|> stays text";
    for m in [common::smollm2(), common::qwen05(), common::gemma3()] {
        let bytes = m.tokenizer.token_bytes();
        assert_eq!(bytes.len(), m.tokenizer.vocab_size());
        // Plain text: no control token inside, so the spelled bytes are the text's.
        let plain = "Héllo wörld, 123  spaces\n\tand \u{1F600} emoji";
        let ids = m.tokenizer.encode(plain).unwrap();
        let spelled: Vec<u8> = ids
            .iter()
            .flat_map(|&i| bytes[i as usize].clone())
            .collect();
        assert_eq!(
            String::from_utf8(spelled).unwrap(),
            m.tokenizer.decode(&ids).unwrap(),
            "{}",
            m.cfg.name
        );
        // Control tokens are marked so no text matches them.
        for &id in &m.tokenizer.stop_ids {
            assert_eq!(bytes[id as usize][0], 0xFF, "{} stop id {id}", m.cfg.name);
        }
        assert!(m.tokenizer.encode(text).is_ok());
    }
}

/// Decode `prompt` under `spec` (greedy unless `temperature`), returning the answer's text.
fn generate(m: &Model, g: &Grammars, spec: &Spec, prompt: &str, temperature: f32) -> String {
    let mut c = g.constraint(spec).expect("grammar compiles");
    let mut sampler = Sampler::new(SamplingParams {
        temperature,
        seed: 7,
        ..SamplingParams::default()
    });
    let mut seq = Sequence::new(m);
    let ids = m.tokenizer.encode_prompt(prompt).unwrap();
    let mut logits = seq.prefill(m, &ids).unwrap();
    let mut out = Vec::new();
    for _ in 0..400 {
        let id = c.draw(&mut sampler, &logits).expect("draw");
        if m.tokenizer.stop_ids.contains(&id) {
            assert!(
                c.is_complete(),
                "an end token only once the grammar is complete"
            );
            return m.tokenizer.decode(&out).unwrap();
        }
        out.push(id);
        logits = seq.prefill(m, &[id]).unwrap();
    }
    panic!(
        "no end within 400 tokens: {:?}",
        m.tokenizer.decode(&out).unwrap()
    );
}

fn chat(m: &Model, user: &str) -> String {
    let t = m.chat.as_ref().unwrap();
    t.render(&[edgeprompt_engine::Message::new("user", user)], true)
        .unwrap()
}

#[test]
fn json_schema_answers_validate() {
    let m = common::smollm2();
    let g = Grammars::for_model(&m).unwrap();
    let schema = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "city": {"enum": ["Paris", "Lima", "Oslo"]}
        },
        "required": ["name", "age", "city"],
        "additionalProperties": false
    });
    let spec = Spec::JsonSchema(schema);
    for (t, user) in [
        (0.0, "Describe a person as JSON."),
        (0.8, "Who lives in Oslo? Answer in JSON."),
        (1.0, "Make up a traveller."),
    ] {
        let text = generate(&m, &g, &spec, &chat(&m, user), t);
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        let o = v.as_object().unwrap();
        assert_eq!(o.len(), 3, "{text}");
        assert!(o["name"].as_str().unwrap().chars().count() <= 20);
        let age = o["age"].as_i64().unwrap();
        assert!((0..=150).contains(&age));
        assert!(["Paris", "Lima", "Oslo"].contains(&o["city"].as_str().unwrap()));
    }
}

#[test]
fn any_json_object_and_regex_and_lark() {
    let m = common::smollm2();
    let g = Grammars::for_model(&m).unwrap();
    let obj = Spec::JsonSchema(json!({
        "type": "object",
        "maxProperties": 3,
        "additionalProperties": {"type": "string", "maxLength": 30}
    }));
    let text = generate(&m, &g, &obj, &chat(&m, "Give me a JSON object."), 0.0);
    assert!(serde_json::from_str::<Value>(&text).unwrap().is_object());

    let rx = Spec::Regex(r"[0-9]{3}-[0-9]{4}".into());
    let text = generate(&m, &g, &rx, &chat(&m, "A phone number?"), 0.0);
    assert_eq!(text.len(), 8, "{text}");
    assert!(text.chars().enumerate().all(|(i, c)| if i == 3 {
        c == '-'
    } else {
        c.is_ascii_digit()
    }));

    let lark = Spec::Lark("start: (\"yes\" | \"no\") \".\"".into());
    let text = generate(&m, &g, &lark, &chat(&m, "Is the sky blue?"), 0.0);
    assert!(text == "yes." || text == "no.", "{text}");
}

#[test]
fn bad_grammars_are_client_errors() {
    let m = common::smollm2();
    let g = Grammars::for_model(&m).unwrap();
    for spec in [
        Spec::Lark("start: undefined_rule".into()),
        Spec::Regex("(unclosed".into()),
        Spec::JsonSchema(json!({"type": "no-such-type"})),
    ] {
        match g.constraint(&spec) {
            Err(GrammarError::Invalid(_)) => {}
            other => panic!("{spec:?}: {:?}", other.map(|_| ())),
        }
    }
}

#[test]
fn a_schema_that_admits_no_answer_is_a_short_client_error() {
    let m = common::smollm2();
    let g = Grammars::for_model(&m).unwrap();
    let cycle = json!({"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}});
    match g.constraint(&Spec::JsonSchema(cycle)) {
        Err(GrammarError::Invalid(m)) => {
            assert!(!m.contains('\n') && !m.contains("<state>"), "{m}")
        }
        other => panic!("a $ref cycle: {:?}", other.map(|_| ())),
    }
}
