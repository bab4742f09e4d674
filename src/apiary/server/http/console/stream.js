// The live event stream, GET /v1/events/stream, read with fetch() so that it carries the
// tab's credential (EventSource cannot send an Authorization header). It reconnects the way
// EventSource does: after the server's `retry:` delay, sending the last id it saw as
// Last-Event-ID, which the server resumes after (it wins over the first request's ?after=).
// A refusal (401, 403) is not retried: the same request would be refused again, so the
// stream waits for the page to start it again with another credential.

import {authHeaders, errorOf, isRefusal} from "./api.js";
import {SseParser} from "./sse.js";

const STREAM = "/v1/events/stream";
const FIRST_RETRY_MS = 3000; // until the server names its own delay

/** Resolves after `ms`, or at once when `signal` aborts. */
function pause(ms, signal) {
  return new Promise((resolve) => {
    const done = () => {
      clearTimeout(timer);
      signal.removeEventListener("abort", done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal.addEventListener("abort", done);
  });
}

export class LiveStream {
  /**
   * `handlers`: onOpen(), onMessage({type, id, data}), onDrop(err or null: it reconnects),
   * onRefused(GatewayError: it stopped).
   */
  constructor(handlers) {
    this.handlers = handlers;
    this.run = null;
  }

  /** Follow the stream from after event `after`, ending any earlier run first. */
  start(after) {
    this.stop();
    const run = {abort: new AbortController(), after, lastId: "", retryMs: FIRST_RETRY_MS};
    this.run = run;
    this.loop(run);
  }

  stop() {
    if (this.run) this.run.abort.abort();
    this.run = null;
  }

  async loop(run) {
    const {signal} = run.abort;
    while (!signal.aborted) {
      const refused = await this.connect(run);
      if (refused || signal.aborted) return;
      await pause(run.retryMs, signal);
    }
  }

  /** One connection until it ends; true when the coordinator refused it. */
  async connect(run) {
    const {signal} = run.abort;
    const headers = {Accept: "text/event-stream", ...authHeaders()};
    if (run.lastId) headers["Last-Event-ID"] = run.lastId;
    let resp;
    try {
      resp = await fetch(`${STREAM}?after=${run.after}`,
        {headers, cache: "no-store", credentials: "same-origin", signal});
    } catch {
      if (!signal.aborted) this.handlers.onDrop(null);
      return false;
    }
    if (!resp.ok) {
      const err = await errorOf(resp);
      if (signal.aborted) return false;
      if (isRefusal(err)) {
        this.handlers.onRefused(err);
        return true;
      }
      this.handlers.onDrop(err);
      return false;
    }
    this.handlers.onOpen();
    const parser = new SseParser(run.lastId);
    const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
    try {
      for (;;) {
        const {value, done} = await reader.read();
        if (done || signal.aborted) break;
        for (const message of parser.push(value)) {
          if (signal.aborted) break;
          this.handlers.onMessage(message);
        }
        run.lastId = parser.lastEventId;
        if (parser.retry !== null) run.retryMs = parser.retry;
      }
    } catch {
      // the connection broke (or was aborted): reconnect below unless stopped
    } finally {
      reader.releaseLock();
    }
    if (!signal.aborted) this.handlers.onDrop(null);
    return false;
  }
}
