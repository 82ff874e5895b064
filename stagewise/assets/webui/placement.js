// The placement view: devices with their stages as bars (planned split beside measured), stages, links.

import { bandwidth, bytes, el, seconds } from "./format.js";

const PARTS = [
  ["weights", "weights_bytes"],
  ["state", "state_bytes"],
  ["workspace", "workspace_bytes"],
  ["reserve", "reserve_bytes"],
];

function bar(total, parts, className) {
  const node = el("div", { class: `bar ${className}` });
  for (const [name, value] of parts) {
    if (!value) continue;
    node.append(el("span", {
      class: `seg ${name}`, title: `${name}: ${bytes(value)}`,
      style: `width: ${(100 * value / total).toFixed(3)}%`,
    }));
  }
  return node;
}

function deviceCard(device, stages) {
  const scale = device.budget_bytes || 1;
  const card = el("div", { class: "device", dataset: { device: device.id } },
    el("div", { class: "device-head" },
      el("strong", { text: device.id }), " ",
      el("span", { class: "muted", text: `${device.name} · budget ${bytes(device.budget_bytes)} · ` +
        `free ${bytes(device.free_bytes ?? device.headroom_bytes)}${device.free_bytes === null ? " (budget − plan)" : ""}` })));
  if (!stages.length) card.append(el("p", { class: "muted", text: "no stage" }));
  for (const stage of stages) {
    const planned = PARTS.map(([name, key]) => [name, stage.planned[key]]);
    const m = stage.measured;
    const measured = [["weights", m.weights_bytes], ["state", m.state_bytes]];
    if (m.workspace_bytes !== null && m.workspace_bytes !== undefined) measured.push(["workspace", m.workspace_bytes]);
    const measuredParts = stage.measured.weights_bytes === null ? [["measured", stage.measured.total_bytes]] : measured;
    card.append(el("div", { class: "stage-bars", dataset: { stage: String(stage.index) } },
      el("div", { class: "stage-label", text: `stage ${stage.index} · blocks ${blockText(stage)}` }),
      el("div", { class: "bar-row" }, el("span", { class: "bar-name", text: "planned" }), bar(scale, planned, "planned")),
      el("div", { class: "bar-row" }, el("span", { class: "bar-name", text: "measured" }),
        bar(scale, measuredParts, "measured"))));
  }
  return card;
}

export function blockText(stage) {
  const [start, end] = stage.blocks;
  let text = end - start === 1 ? `${start}` : `${start}–${end - 1}`;
  if (stage.entry) text = `embedding + ${text}`;
  if (stage.exit) text = `${text} + head`;
  return text;
}

export function renderPlacement(placement) {
  document.getElementById("summary").textContent = placement.summary;
  document.getElementById("fingerprint").textContent = placement.fingerprint;
  const devices = document.getElementById("devices");
  devices.replaceChildren(...placement.devices.map((d) =>
    deviceCard(d, placement.stages.filter((s) => s.device === d.id))));
  const body = document.querySelector("#stages tbody");
  body.replaceChildren(...placement.stages.map((s) => el("tr", {
    class: "stage", dataset: {
      stage: String(s.index), device: s.device, blocks: `${s.blocks[0]}-${s.blocks[1]}`,
      plannedTotal: String(s.planned.total_bytes), measuredTotal: String(s.measured.total_bytes),
    },
  },
  el("td", { text: String(s.index) }), el("td", { text: s.device }), el("td", { text: blockText(s) }),
  ...PARTS.map(([, key]) => el("td", { text: bytes(s.planned[key]) })),
  el("td", { text: bytes(s.planned.total_bytes) }),
  el("td", { text: s.measured.peak_bytes != null ? `${bytes(s.measured.peak_bytes)} peak` : bytes(s.measured.total_bytes),
    title: s.measured.peak_bytes != null ? `weights + state ${bytes(s.measured.total_bytes)}; workspace at the peak ` +
      `${bytes(s.measured.workspace_bytes)} (planned ${bytes(s.planned.workspace_bytes)})` : "weights + state" }),
  el("td", { text: bytes(s.budget_bytes) }))));
  const links = document.querySelector("#links tbody");
  links.replaceChildren(...placement.links.map((l) => el("tr", { dataset: { kind: l.kind } },
    el("td", { text: `${l.between[0]} ↔ ${l.between[1]}` }), el("td", { text: l.kind }),
    el("td", { text: `${bandwidth(l.bandwidth_bytes_per_s)}${l.measured ? " (measured)" : " (default)"}` }),
    el("td", { text: seconds(l.latency_s) }), el("td", { text: l.boundary ? "stage handoff" : "" }))));
}
