// The chat page in a real browser: headless Chromium (Debian's) driven by playwright-core.
// Two turns on a cloud prompt: the first cold (its KV streams from the cloud, the timeline is
// drawn), the second warm (from memory, nothing down). Each streamed answer must be the API's
// own answer to the same request, whole. A screenshot of the page goes to the given path.
//   node chat.mjs BASE_URL SCREENSHOT.png
import { chromium } from "playwright-core";

const [base, shot, keyed, key] = process.argv.slice(2);
if (!base || !shot) throw new Error("usage: node chat.mjs BASE_URL SCREENSHOT.png [KEYED_URL KEY]");
const PROMPT = "rail-support";
const TURNS = [
  "I cancel my ticket three hours before the train leaves. Do I get my money back?",
  "And can my dog come with me?",
];
const check = (ok, what) => {
  if (!ok) throw new Error("failed: " + what);
  console.log("ok: " + what);
};

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  headless: true,
  args: ["--no-sandbox"],
});
try {
  const page = await browser.newPage({ viewport: { width: 1100, height: 900 } });
  const problems = [];
  page.on("pageerror", (e) => problems.push("page error: " + e.message));
  page.on("console", (m) => m.type() === "error" && problems.push("console: " + m.text()));

  await page.goto(base);
  await page.waitForSelector(`#cloud option[value="${PROMPT}"]`, { state: "attached", timeout: 30000 });
  await page.selectOption("#cloud", PROMPT);
  const model = (await page.textContent("#model")).replace("·", "").trim();
  check(model.length > 0, `the page names the model (${model})`);

  const history = [];
  for (const [turn, text] of TURNS.entries()) {
    // Count the answer's updates: a streamed answer arrives in pieces.
    await page.evaluate(() => {
      window.__updates = 0;
      new MutationObserver((ms) => {
        for (const m of ms) {
          if (m.target.closest && m.target.closest(".msg.assistant")) window.__updates++;
          else if (m.target.parentElement && m.target.parentElement.closest(".msg.assistant")) window.__updates++;
        }
      }).observe(document.getElementById("log"), { subtree: true, childList: true, characterData: true });
    });
    await page.fill("#text", text);
    await page.press("#text", "Enter");
    await page.waitForSelector(`.facts >> nth=${turn}`, { timeout: 120000 });
    const answer = await page.textContent(`.msg.assistant >> nth=${turn} >> .content`);
    const updates = await page.evaluate(() => window.__updates);
    check(answer.trim().length > 0, `turn ${turn + 1}: an answer (${JSON.stringify(answer.slice(0, 60))}...)`);
    check(updates > 2, `turn ${turn + 1}: streamed (${updates} updates)`);

    // The page shows the API's answer: the same request, not streamed.
    history.push({ role: "user", content: text });
    const r = await fetch(base + "/v1/chat/completions", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ model, messages: history, max_tokens: 128, temperature: 0, cloud_prompt: PROMPT }),
    });
    const whole = await r.json();
    check(r.ok, `turn ${turn + 1}: the API answers the same request`);
    check(whole.choices[0].message.content === answer, `turn ${turn + 1}: the page shows the API's answer, whole`);
    history.push({ role: "assistant", content: answer });

    const facts = page.locator(".facts").nth(turn);
    const source = await facts.getAttribute("data-source");
    const info = await facts.textContent();
    if (turn === 0) {
      check(source === "cloud", "turn 1: the cloud prompt's KV came from the cloud");
      const cloud = await facts.locator("svg.timeline rect.cloud").count();
      const edge = await facts.locator("svg.timeline rect.edge").count();
      check(cloud > 0 && edge === cloud, `turn 1: the timeline draws ${cloud} cloud layers and ${edge} private layers`);
      check(/Bytes down[^]*(KiB|MiB)/.test(info), "turn 1: the KV's bytes down are shown");
    } else {
      check(source === "memory", "turn 2: the cloud prompt's KV came from memory");
      check(/Bytes down\s*0 B/.test(info), "turn 2: nothing came down");
      check((await facts.locator("svg.timeline").count()) === 0, "turn 2: no timeline");
      check(/by earlier turns/.test(info), "turn 2: the private prompt ran on turn 1's kept KV");
    }
    check(/First token/.test(info) && /never sent/.test(info), `turn ${turn + 1}: TTFT and the private prompt shown`);
  }
  await page.screenshot({ path: shot, fullPage: true });
  console.log("screenshot: " + shot);
  check(problems.length === 0, "no page errors (" + problems.join("; ") + ")");

  if (keyed) {
    // An edge whose API wants a key and has no cloud: the page asks for the key, then chats.
    const p = await browser.newPage();
    const errors = [];
    p.on("pageerror", (e) => errors.push(e.message));
    await p.goto(keyed);
    await p.waitForSelector("#keyrow", { state: "visible", timeout: 30000 });
    check(/API key/.test(await p.textContent("#intro")), "keyed edge: the page asks for the API key");
    await p.fill("#key", key);
    await p.dispatchEvent("#key", "change");
    await p.waitForFunction(() => document.getElementById("model").textContent.length > 2);
    await p.fill("#text", "Say hello.");
    await p.press("#text", "Enter");
    await p.waitForSelector(".facts", { timeout: 120000 });
    const answer = await p.textContent(".msg.assistant .content");
    const facts = await p.textContent(".facts");
    check(answer.trim().length > 0, "keyed edge: an answer with the key");
    check(/none: the whole prompt was computed on this edge/.test(facts), "keyed edge: no cloud prompt");
    check(errors.length === 0, "keyed edge: no page errors");
  }
} finally {
  await browser.close();
}
