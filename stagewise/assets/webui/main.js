// The page: polls /v1/stagewise/status once a second (through restarts and while the key is asked for)
// and hands each part to its pane.

import { apiKey, fetchStatus, setApiKey, Unauthorized } from "./api.js";
import { setUpChat } from "./chat.js";
import { forgetHistory, renderLive } from "./live.js";
import { renderPlacement } from "./placement.js";

const POLL_S = 1;
let shownPlacement = "";
let polls = 0;
let waitingForKey = false;

function askForKey() {
  if (waitingForKey) return;
  waitingForKey = true;
  const dialog = document.getElementById("key-dialog");
  document.getElementById("key-input").value = apiKey();
  dialog.showModal();
}

function setUpKey() {
  const dialog = document.getElementById("key-dialog");
  dialog.addEventListener("close", () => {
    if (dialog.returnValue === "save") setApiKey(document.getElementById("key-input").value.trim());
    waitingForKey = false;
  });
  document.getElementById("key-button").addEventListener("click", askForKey);
}

function setPhase(phase, connection) {
  const pill = document.getElementById("phase");
  pill.textContent = phase;
  pill.dataset.phase = phase;
  document.body.dataset.phase = phase;
  document.getElementById("connection").textContent = connection;
}

function show(status) {
  document.body.dataset.model = status.model || "";
  document.getElementById("model-name").textContent = status.model || "(loading)";
  setPhase(status.phase, "");
  if (status.placement) {
    const text = JSON.stringify(status.placement);
    if (text !== shownPlacement) {
      renderPlacement(status.placement);
      shownPlacement = text;
    }
    document.body.dataset.fingerprint = status.placement.fingerprint;
  }
  if (status.live) renderLive(status.live);
}

async function poll() {
  try {
    const status = await fetchStatus(AbortSignal.timeout(5000));
    if (document.body.dataset.connected === "false") forgetHistory(); // back after a gap: perhaps a new server
    document.body.dataset.connected = "true";
    show(status);
    if (polls === 0) performance.mark("stagewise:first-status"); // page load to placement shown (bench/webui_load.py)
    polls += 1;
    document.body.dataset.polls = String(polls);
  } catch (error) {
    if (error instanceof Unauthorized) {
      setPhase("needs API key", error.message);
      askForKey();
    } else {
      document.body.dataset.connected = "false";
      setPhase("unreachable", `retrying every ${POLL_S} s (${error.message})`);
    }
  }
  setTimeout(poll, POLL_S * 1000);
}

setUpKey();
setUpChat(askForKey);
poll();
