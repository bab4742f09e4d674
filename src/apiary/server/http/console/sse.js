// Server-sent events parsed as the HTML standard's event stream interpretation does it, for a
// stream read with fetch(): EventSource cannot send an Authorization header, so the console
// reads GET /v1/events/stream itself. Text goes in as it arrives, split anywhere (even
// between the CR and LF of one line break); complete messages come out. No DOM: the same
// module runs in the page and under Node (tests/server/test_console_signin.py).

// A line ends at CRLF, LF or CR.
const LINE_END = /\r\n|\r|\n/g;

export class SseParser {
  /** `lastEventId`: the id a reconnecting stream resumes from (it persists, as in EventSource). */
  constructor(lastEventId = "") {
    this.lastEventId = lastEventId;
    /** The reconnection delay the server asked for (`retry:`), in ms; null until it does. */
    this.retry = null;
    this.pending = "";
    this.afterCR = false; // the last text ended with a CR: an LF first in the next one is its pair
    this.data = [];
    this.type = "";
  }

  /** The messages `text` completes: {type, id, data}, `id` being the last event id then. */
  push(text) {
    const messages = [];
    if (!text) return messages;
    const buffer = this.pending + (this.afterCR && text.startsWith("\n") ? text.slice(1) : text);
    this.afterCR = text.endsWith("\r");
    let start = 0;
    LINE_END.lastIndex = 0;
    for (let end = LINE_END.exec(buffer); end !== null; end = LINE_END.exec(buffer)) {
      this.line(buffer.slice(start, end.index), messages);
      start = LINE_END.lastIndex;
    }
    this.pending = buffer.slice(start);
    return messages;
  }

  line(text, messages) {
    if (text === "") {
      this.dispatch(messages);
      return;
    }
    if (text.startsWith(":")) return; // a comment: the server's keep-alives
    const colon = text.indexOf(":");
    const field = colon < 0 ? text : text.slice(0, colon);
    let value = colon < 0 ? "" : text.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "data") this.data.push(value);
    else if (field === "event") this.type = value;
    else if (field === "id" && !value.includes("\0")) this.lastEventId = value;
    else if (field === "retry" && /^\d+$/.test(value)) this.retry = Number(value);
    // any other field is ignored, as the standard says
  }

  dispatch(messages) {
    const data = this.data;
    const type = this.type || "message";
    this.data = [];
    this.type = "";
    if (!data.length) return; // a frame without data (only an id, say) is no message
    messages.push({type, id: this.lastEventId, data: data.join("\n")});
  }
}
