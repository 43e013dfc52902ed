// The edge's chat page: streams answers from /v1/chat/completions and shows each answer's
// `edgeprompt` block. Model text is only ever set as textContent.
"use strict";

const $ = (id) => document.getElementById(id);
const SVG = "http://www.w3.org/2000/svg";
let model = null;
let history = [];
let busy = false;
// This tab's scope in the edge's private prefix cache: no other client can run on its turns.
const SALT = Array.from(crypto.getRandomValues(new Uint8Array(16)), (b) => b.toString(16).padStart(2, "0")).join("");

const SOURCES = {
  memory: "this edge's memory",
  disk: "this edge's disk",
  peer: "a peer edge",
  cloud: "the cloud, layer by layer",
  local: "computed on this edge",
};

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = sessionStorage.getItem("edgeprompt-key");
  if (key) h.Authorization = "Bearer " + key;
  return h;
}

async function api(path, init = {}) {
  const r = await fetch(path, { ...init, headers: headers() });
  if (r.status === 401) {
    $("keyrow").hidden = false;
    throw new Error("this edge needs an API key: enter it above");
  }
  if (!r.ok) {
    let msg = r.status + " " + r.statusText;
    try { msg = (await r.json()).error.message || msg; } catch (_) { /* not JSON */ }
    throw new Error(msg);
  }
  return r;
}

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function svg(tag, attrs, text) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

function bytes(n) {
  if (n < 1024) return n + " B";
  if (n < 1 << 20) return (n / 1024).toFixed(1) + " KiB";
  return (n / (1 << 20)).toFixed(2) + " MiB";
}

function secs(s) {
  return s < 1 ? (s * 1000).toFixed(0) + " ms" : s.toFixed(2) + " s";
}

async function loadModel() {
  const r = await api("/v1/models");
  model = (await r.json()).data[0].id;
  $("model").textContent = "· " + model;
}

async function loadPrompts() {
  const r = await api("/v1/cloud_prompts");
  const list = await r.json();
  const sel = $("cloud");
  const keep = sel.value;
  while (sel.options.length > 1) sel.remove(1);
  for (const p of list.data) {
    const o = el("option", null, `${p.id} · ${p.tokens} tokens${p.in_memory ? " · in memory" : ""}`);
    o.value = p.id;
    sel.append(o);
  }
  if ([...sel.options].some((o) => o.value === keep)) sel.value = keep;
  else if (list.data.length) sel.value = list.data[0].id;
  // One status line, and the list asked again while the cloud cannot be reached (an edge
  // started before its cloud lists the cloud's prompts once it answers).
  const old = document.getElementById("cloud-status");
  if (old) old.remove();
  clearTimeout(loadPrompts.again);
  if (list.cloud === "unreachable") {
    const s = el("span", "error", ` The cloud did not answer (${list.cloud_error}); ids held here are listed.`);
    s.id = "cloud-status";
    $("intro").append(s);
    loadPrompts.again = setTimeout(() => loadPrompts().catch(() => {}), 3000);
  }
}

function timeline(block) {
  const t = block.timeline;
  const a = block.admitted_s;
  const end = Math.max(block.ttft_s || 0, ...t.map((l) => a + Math.max(l.arrived, l.compute_end)));
  const W = 860, left = 56, right = 28, top = 22, row = 7;
  const H = top + t.length * row + 26;
  const x = (s) => left + (s / end) * (W - left - right);
  const s = svg("svg", { class: "timeline", viewBox: `0 0 ${W} ${H}`, role: "img",
    "aria-label": "when each cloud layer landed and each private layer ran" });
  for (let i = 0; i <= 4; i++) {
    const v = (end * i) / 4;
    s.append(svg("line", { x1: x(v), x2: x(v), y1: top - 4, y2: H - 22, stroke: "#e6e9ef" }));
    s.append(svg("text", { x: x(v), y: H - 8, "font-size": 11, "text-anchor": "middle", fill: "#667085" }, secs(v)));
  }
  s.append(svg("text", { x: 0, y: top + 8, "font-size": 11, fill: "#667085" }, "layer 0"));
  s.append(svg("text", { x: 0, y: top + t.length * row, "font-size": 11, fill: "#667085" }, "layer " + (t.length - 1)));
  let prev = a;
  for (const [i, l] of t.entries()) {
    const y = top + i * row;
    const landed = a + l.arrived;
    // A layer from the wire: its transfer since the previous one landed. Computed here: none.
    if (l.wire_bytes > 0) {
      s.append(svg("rect", { class: "cloud", x: x(Math.min(prev, landed)), y, height: row - 2,
        width: Math.max(1.5, x(landed) - x(Math.min(prev, landed))), fill: "#2f6fde", opacity: 0.75 }));
    }
    prev = Math.max(prev, landed);
    s.append(svg("rect", { class: "edge", x: x(a + l.compute_start), y, height: row - 2,
      width: Math.max(1.5, x(a + l.compute_end) - x(a + l.compute_start)), fill: "#1f9d55" }));
  }
  if (block.ttft_s) {
    const tx = x(block.ttft_s);
    s.append(svg("line", { x1: tx, x2: tx, y1: top - 6, y2: H - 22, stroke: "#1d2330", "stroke-dasharray": "3 3" }));
    s.append(svg("text", { x: tx, y: 12, "font-size": 11, fill: "#1d2330", "text-anchor": "end" },
      "first token " + secs(block.ttft_s)));
  }
  return s;
}

function facts(block, usage) {
  const box = el("div", "facts");
  box.dataset.source = block.cloud_prompt ? block.cloud_prompt.source : "none";
  const dl = el("dl");
  const add = (k, v) => { dl.append(el("dt", null, k)); const d = el("dd"); d.append(v); dl.append(d); };
  const c = block.cloud_prompt;
  if (c) {
    const src = el("span", "src " + c.source, SOURCES[c.source] || c.source);
    const what = document.createDocumentFragment();
    what.append(`${c.id ? "“" + c.id + "”, " : ""}${c.tokens} tokens, KV from `, src);
    add("Cloud prompt", what);
    add("Bytes up", `${bytes(c.bytes_up)}${c.bytes_up ? " (the prompt's name and the model's fingerprint)" : " (nothing asked)"}`);
    add("Bytes down", `${bytes(c.bytes_down)}${c.bytes_down ? " of KV" : ""}`);
  } else {
    add("Cloud prompt", "none: the whole prompt was computed on this edge");
  }
  const kept = block.private_cached_tokens ? ` (${block.private_cached_tokens} of them by earlier turns)` : "";
  add("Private prompt", `${block.private_tokens} tokens, computed here${kept}, never sent`);
  if (block.ttft_s != null) add("First token", secs(block.ttft_s));
  if (usage) add("Answer", `${usage.completion_tokens} tokens`);
  box.append(dl);
  if (block.timeline && block.timeline.length) {
    const legend = el("div", "legend");
    const key = (color, text) => { const s = el("span"); const i = el("i"); i.style.background = color; s.append(i, text); legend.append(s); };
    key("#2f6fde", "cloud layer on the wire");
    key("#1f9d55", "private layer computed here");
    box.append(legend, timeline(block));
  } else if (c) {
    box.append(el("div", "hint", "No layers streamed for this answer: the cloud prompt's KV was whole before it started."));
  }
  return box;
}

async function send(text) {
  const log = $("log");
  const user = el("div", "msg user");
  user.append(el("div", "who", "you (private)"), text);
  log.append(user);
  const out = el("div", "msg assistant");
  const body = el("div", "content");
  out.append(el("div", "who", model || "edge"), body);
  log.append(out);
  history.push({ role: "user", content: text });
  const req = {
    model, stream: true, messages: history,
    max_tokens: Number($("max").value) || 128,
    temperature: Number($("temp").value),
    stream_options: { include_usage: true },
    cache_salt: SALT,
  };
  const cloud = $("cloud").value;
  if (cloud) req.cloud_prompt = cloud;
  let answer = "", block = null, usage = null;
  try {
    const r = await api("/v1/chat/completions", { method: "POST", body: JSON.stringify(req) });
    const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += value;
      let cut;
      while ((cut = buf.indexOf("\n\n")) >= 0) {
        const event = buf.slice(0, cut);
        buf = buf.slice(cut + 2);
        for (const line of event.split("\n")) {
          if (!line.startsWith("data:")) continue;
          const data = line.slice(5).trim();
          if (data === "[DONE]") continue;
          const v = JSON.parse(data);
          if (v.error) throw new Error(v.error.message);
          const d = v.choices && v.choices[0] && v.choices[0].delta;
          if (d && d.content) { answer += d.content; body.textContent = answer; }
          if (v.edgeprompt) block = v.edgeprompt;
          if (v.usage) usage = v.usage;
        }
      }
    }
    history.push({ role: "assistant", content: answer });
    if (block) log.append(facts(block, usage));
    loadPrompts().catch(() => {});
  } catch (e) {
    history.pop();
    out.append(el("div", "error", String(e.message || e)));
  }
  window.scrollTo(0, document.body.scrollHeight);
}

$("ask").addEventListener("submit", async (e) => {
  e.preventDefault();
  const text = $("text").value.trim();
  if (!text || busy) return;
  busy = true;
  $("send").disabled = true;
  $("text").value = "";
  await send(text);
  busy = false;
  $("send").disabled = false;
  $("text").focus();
});

$("text").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); $("ask").requestSubmit(); }
});

$("reset").addEventListener("click", () => {
  history = [];
  for (const n of [...$("log").children]) if (n.id !== "intro") n.remove();
});

$("key").addEventListener("change", () => {
  sessionStorage.setItem("edgeprompt-key", $("key").value);
  start();
});

async function start() {
  try {
    await loadModel();
    await loadPrompts();
  } catch (e) {
    $("intro").append(el("div", "error", String(e.message || e)));
  }
}
start();
