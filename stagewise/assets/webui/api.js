// The page's one door to the server: the API key (this tab only) and requests that carry it.

const KEY_SLOT = "stagewise.api_key"; // sessionStorage: gone when the tab closes; never sent anywhere but here

export class Unauthorized extends Error {
  constructor(message) {
    super(message);
    this.name = "Unauthorized";
  }
}

export function apiKey() {
  return sessionStorage.getItem(KEY_SLOT) || "";
}

export function setApiKey(key) {
  if (key) sessionStorage.setItem(KEY_SLOT, key);
  else sessionStorage.removeItem(KEY_SLOT);
}

function headers(extra) {
  const out = { ...extra };
  const key = apiKey();
  if (key) out.Authorization = `Bearer ${key}`;
  return out;
}

async function errorText(response) {
  try {
    const body = await response.json();
    return body.error?.message || JSON.stringify(body);
  } catch {
    return `HTTP ${response.status}`;
  }
}

/** GET /v1/stagewise/status as JSON; Unauthorized on 401, Error otherwise. */
export async function fetchStatus(signal) {
  const response = await fetch("/v1/stagewise/status", { headers: headers({}), cache: "no-store", signal });
  if (response.status === 401) throw new Unauthorized(await errorText(response));
  if (!response.ok) throw new Error(await errorText(response));
  return response.json();
}

/** POST /v1/chat/completions with stream: true; calls onChunk(parsed chunk) per SSE event. */
export async function streamChat(body, onChunk, signal) {
  const response = await fetch("/v1/chat/completions", {
    method: "POST",
    headers: headers({ "Content-Type": "application/json", Accept: "text/event-stream" }),
    body: JSON.stringify({ ...body, stream: true, stream_options: { include_usage: true } }),
    signal,
  });
  if (response.status === 401) throw new Unauthorized(await errorText(response));
  if (!response.ok) throw new Error(await errorText(response));
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data === "[DONE]") return;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new Error(chunk.error.message || "the server reported an error");
        onChunk(chunk);
      }
    }
  }
  throw new Error("the stream ended before [DONE] (server gone?)");
}
