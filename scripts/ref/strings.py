"""Strings the tokenizer fixtures encode (shared by tokenizer_fixture.py and
tokenizer_llamacpp.py): scripts, code, whitespace, digits, emoji, chat markers, ShareGPT text."""
from pathlib import Path

from split_pairs import records

SHAREGPT = Path(__file__).resolve().parents[2] / "models" / "ShareGPT_V3_unfiltered_cleaned_split.json"

COMMON = [
    "", " ", "Hello world", "Hello, world!", " Hello world", "hello   world", "Hello world ",
    "The quick brown fox jumps over the lazy dog.",
    "In 1969, Neil Armstrong walked on the Moon; it was a giant leap for mankind.",
    "Why is the sky blue? Rayleigh scattering, mostly.",
    "I'm sure they'll say we've done what you'd expect, isn't it?", "DON'T SHOUT. I'LL LISTEN.",
    "It's John's book's cover", "1234567890", "3.14159265358979", "-42 + 17 = -25",
    "Version 2.0.1 released on 2024-05-13 at 10:30:00", "$1,299.99 (20% off)", "x  1", "a\t\t2",
    "  42  ", "0x1F 0b1010 1e-9",
    "tab\tseparated\tvalues", "line1\nline2", "para1\n\n\npara2", "trailing spaces   ",
    "    four leading spaces", "\n", "\n\n", "\t", "   ", "mixed \t \n \r\n whitespace",
    "日本語のテキストです。", "你好，世界！今天天气很好。", "한국어 문장입니다", "Привет, мир!",
    "Ελληνικά γράμματα", "مرحبا بالعالم", "שלום עולם", "हिन्दी भाषा", "Café naïve résumé façade",
    "e\u0301 a\u0300 o\u0308 (combining marks)", "Emoji: 😀🎉👍🏽 👨‍👩‍👧‍👦 🇫🇷", "∑ x² ≤ ∞ → λ ∈ ℝ",
    "fn main() {\n    let x: Vec<u32> = (0..10).map(|i| i * i).collect();\n    println!(\"{x:?}\");\n}\n",
    "impl<'a> Iterator for Foo<'a> { type Item = &'a str; }",
    "def f(x):\n    if x > 0:\n        return x ** 2\n    else:\n        return -x\n",
    "class A:\n\tdef __init__(self):\n\t\tself.items = []  # tabs\n",
    '{"name": "EdgePrompt", "version": 1, "tags": ["llm", "edge"], "ok": true, "n": null}',
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
    "<div class=\"x\">&nbsp;<br/></div>", "https://example.com/path?q=1&r=two#frag",
    "user@example.com", "C:\\Users\\name\\file.txt", "~/.config/app/settings.toml",
    "!!!???...,,,;;;", "----====____****", "a" * 50, "abc " * 12,
    "<|im_start|>user\nhi<|im_end|>",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWhat is 2+2?"
    "<|im_end|>\n<|im_start|>assistant\n",
    "text<|im_end|>text", " <|im_start|> spaced <|im_end|> ",
]

def sharegpt_snippets(n=4):
    out = []
    for r in records(SHAREGPT, limit=60)[::15][:n]:
        conv = r.get("conversations", [])
        if conv:
            out.append(conv[0]["value"][:300])
    return out
