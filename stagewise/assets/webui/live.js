// The live pane: counters, per-stage KV and timings, and a chart of the last minutes' tokens/s.

import { bytes, el, rate, seconds } from "./format.js";

const HISTORY_S = 300;
const history = []; // {t, decode, prefill}: the server's monotonic clock, tokens/s

function set(id, text) {
  document.getElementById(id).textContent = text;
}

export function renderLive(live) {
  set("live-running", `${live.running} / ${live.sequence_slots}`);
  set("live-waiting", String(live.waiting));
  set("live-prefill", rate(live.prefill_tokens_per_s));
  set("live-decode", rate(live.decode_tokens_per_s));
  set("live-generated", String(live.generation_tokens_total));
  set("live-requests", String(live.requests_total));
  const body = document.querySelector("#live-stages tbody");
  body.replaceChildren(...live.stages.map((s) => el("tr", { class: "live-stage", dataset: { stage: String(s.index) } },
    el("td", { text: String(s.index) }),
    el("td", { class: "kv", text: s.kv_blocks ? `${s.kv_blocks_in_use} / ${s.kv_blocks}` : "–" }),
    el("td", { text: bytes(s.state_bytes_in_use) }),
    el("td", { text: seconds(s.step_s) }), el("td", { text: rate(s.steps_per_s) }),
    el("td", { text: s.index < live.handoffs.length ? seconds(live.handoffs[s.index].handoff_s) : "" }))));
  if (live.interval_s !== null) {
    history.push({ t: live.time_s, decode: live.decode_tokens_per_s, prefill: live.prefill_tokens_per_s });
    while (history.length && live.time_s - history[0].t > HISTORY_S) history.shift();
  }
  drawChart();
}

export function forgetHistory() {
  history.length = 0; // a restarted server has a new clock
}

function drawChart() {
  const canvas = document.getElementById("chart");
  const ctx = canvas.getContext("2d");
  const { width, height } = canvas;
  ctx.clearRect(0, 0, width, height);
  if (!history.length) return;
  const now = history[history.length - 1].t;
  const top = Math.max(1, ...history.map((h) => Math.max(h.decode, h.prefill)));
  const style = getComputedStyle(document.documentElement);
  ctx.font = "11px sans-serif";
  ctx.fillStyle = style.getPropertyValue("--muted");
  ctx.fillText(`${rate(top)} tok/s`, 4, 12);
  for (const [key, color] of [["prefill", "--prefill"], ["decode", "--decode"]]) {
    ctx.strokeStyle = style.getPropertyValue(color);
    ctx.lineWidth = 1.5;
    ctx.beginPath();
    history.forEach((h, i) => {
      const x = width - (now - h.t) / HISTORY_S * width;
      const y = height - 2 - h[key] / top * (height - 18);
      if (i === 0) ctx.moveTo(x, y);
      else ctx.lineTo(x, y);
    });
    ctx.stroke();
  }
}
