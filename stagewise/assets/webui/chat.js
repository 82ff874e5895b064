// The chat pane: a conversation streamed through /v1/chat/completions, with TTFT and tokens/s per answer,
// reasoning (<think>…</think> or reasoning deltas) and tool calls rendered apart from the answer.

import { streamChat } from "./api.js";
import { el, rate, seconds } from "./format.js";

const conversation = []; // OpenAI messages, without the system prompt
let running = null; // the AbortController of the answer being streamed

function settings() {
  const body = {
    model: document.body.dataset.model || undefined,
    temperature: Number(document.getElementById("temperature").value),
    max_tokens: Number(document.getElementById("max-tokens").value),
  };
  const stop = document.getElementById("stop").value.split("\n").filter((s) => s.length);
  if (stop.length) body.stop = stop;
  const tools = document.getElementById("tools").value.trim();
  if (tools) {
    body.tools = JSON.parse(tools); // a mistake shows as this answer's error
    body.tool_choice = document.getElementById("tool-choice").value;
  }
  const system = document.getElementById("system-prompt").value.trim();
  body.messages = [...(system ? [{ role: "system", content: system }] : []), ...conversation];
  return body;
}

/** Text split into reasoning (inside <think>…</think>, also while still open) and the answer. */
export function splitReasoning(text) {
  const open = text.indexOf("<think>");
  if (open < 0) return { reasoning: "", answer: text };
  const close = text.indexOf("</think>", open);
  if (close < 0) return { reasoning: text.slice(open + 7), answer: text.slice(0, open) };
  return { reasoning: text.slice(open + 7, close), answer: text.slice(0, open) + text.slice(close + 8) };
}

function bubble(role, text) {
  const node = el("div", { class: `message ${role}`, dataset: { role } },
    el("div", { class: "role", text: role }));
  if (text !== undefined) node.append(el("div", { class: "content", text }));
  document.getElementById("messages").append(node);
  node.scrollIntoView({ block: "end" });
  return node;
}

export class Answer {
  constructor() {
    this.node = bubble("assistant");
    this.reasoningNode = el("details", { class: "reasoning", open: "" }, el("summary", { text: "reasoning" }),
      el("div", { class: "reasoning-text" }));
    this.reasoningNode.hidden = true;
    this.content = el("div", { class: "content" });
    this.tools = el("div", { class: "tool-calls" });
    this.stats = el("div", { class: "stats muted", text: "waiting for the first token…" });
    this.node.append(this.reasoningNode, this.content, this.tools, this.stats);
    this.text = "";
    this.reasoning = "";
    this.calls = [];
    this.chunks = 0;
    this.usage = null;
    this.started = performance.now();
    this.first = null;
    this.finish = null;
  }

  add(chunk) {
    if (chunk.usage) this.usage = chunk.usage;
    for (const choice of chunk.choices || []) {
      const delta = choice.delta || {};
      const reasoning = delta.reasoning_content ?? delta.reasoning;
      const got = delta.content || reasoning || delta.tool_calls;
      if (got && this.first === null) this.first = performance.now();
      if (got) this.chunks += 1;
      if (delta.content) this.text += delta.content;
      if (reasoning) this.reasoning += reasoning;
      for (const call of delta.tool_calls || []) {
        const slot = (this.calls[call.index ?? this.calls.length] ||= { id: "", type: "function", function: { name: "", arguments: "" } });
        if (call.id) slot.id = call.id;
        if (call.function?.name) slot.function.name += call.function.name;
        if (call.function?.arguments) slot.function.arguments += call.function.arguments;
      }
      if (choice.finish_reason) this.finish = choice.finish_reason;
    }
    this.render();
  }

  render() {
    const split = splitReasoning(this.text);
    const reasoning = this.reasoning + split.reasoning;
    this.reasoningNode.hidden = !reasoning;
    this.reasoningNode.querySelector(".reasoning-text").textContent = reasoning;
    this.content.textContent = split.answer;
    this.tools.replaceChildren(...this.calls.map((c) => el("div", { class: "tool-call" },
      el("span", { class: "tool-name", text: `tool call: ${c.function.name}` }),
      el("pre", { text: c.function.arguments }))));
    if (this.first !== null) {
      const ttft = (this.first - this.started) / 1000;
      const tokens = this.usage?.completion_tokens ?? this.chunks;
      const decodeS = (performance.now() - this.first) / 1000;
      const perS = tokens > 1 && decodeS > 0 ? (tokens - 1) / decodeS : null;
      this.stats.textContent = `TTFT ${seconds(ttft)} · ${rate(perS)} tok/s · ${tokens} tokens` +
        (this.finish ? ` · ${this.finish}` : "");
      this.stats.dataset.ttftS = String(ttft);
      this.stats.dataset.tokens = String(tokens);
    }
  }

  fail(error) {
    this.node.classList.add("failed");
    this.stats.textContent = error.name === "AbortError" ? `stopped · ${this.stats.textContent}` : `error: ${error.message}`;
  }

  message() {
    const out = { role: "assistant", content: this.text };
    if (this.reasoning) out.reasoning_content = this.reasoning; // the model's template decides whether to keep it
    if (this.calls.length) out.tool_calls = this.calls;
    return out;
  }
}

async function send(text, onUnauthorized) {
  conversation.push({ role: "user", content: text });
  bubble("user", text);
  const answer = new Answer();
  running = new AbortController();
  setRunning(true);
  try {
    await streamChat(settings(), (chunk) => answer.add(chunk), running.signal);
    answer.render(); // the final figures (usage came last)
    answer.node.dataset.done = "true";
    conversation.push(answer.message());
  } catch (error) {
    answer.render();
    answer.fail(error);
    answer.node.dataset.done = "error";
    conversation.pop(); // the turn did not happen: asking again resends it
    if (error.name === "Unauthorized") onUnauthorized();
  } finally {
    running = null;
    setRunning(false);
  }
}

function setRunning(on) {
  document.getElementById("send").disabled = on;
  document.getElementById("stop-answer").disabled = !on;
}

export function setUpChat(onUnauthorized) {
  const form = document.getElementById("chat-form");
  const prompt = document.getElementById("prompt");
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const text = prompt.value.trim();
    if (!text || running) return;
    prompt.value = "";
    send(text, onUnauthorized);
  });
  prompt.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey) {
      event.preventDefault();
      form.requestSubmit();
    }
  });
  document.getElementById("stop-answer").addEventListener("click", () => running?.abort());
  document.getElementById("clear").addEventListener("click", () => {
    running?.abort();
    conversation.length = 0;
    document.getElementById("messages").replaceChildren();
  });
}
