// The WebSocket client (/v1/ws): one connection for every run the page shows and the run list.
//
// Each subscribed run keeps a cursor, the seq after the last event it handed on. After a drop
// the client reconnects with backoff and re-subscribes every run from its cursor, so a screen
// sees each event once, in order, with no gap; an event at or below the cursor (a re-send) is
// dropped here.

const MIN_BACKOFF_MS = 250;
// A local daemon restarts in seconds: a page waiting longer than this between tries looks dead.
const MAX_BACKOFF_MS = 3000;

export class Live {
  constructor(onState = () => {}) {
    this.socket = null;
    this.runs = new Map(); // run -> {next, onEvent, onStatus, onError}
    this.watchers = new Set();
    this.backoff = MIN_BACKOFF_MS;
    this.retry = null;
    this.stopped = false;
    this.onState = onState;
  }

  start() {
    this.stopped = false;
    this.connect();
  }

  stop() {
    this.stopped = true;
    clearTimeout(this.retry);
    this.socket?.close(1000, "the page closed it");
    this.socket = null;
  }

  connect() {
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    const socket = new WebSocket(`${scheme}//${location.host}/v1/ws`);
    this.socket = socket;
    this.onState("connecting");
    socket.addEventListener("open", () => {
      this.backoff = MIN_BACKOFF_MS;
      this.onState("live");
      for (const [run, subscription] of this.runs) this.sendSubscribe(run, subscription.next);
      if (this.watchers.size) this.send({ op: "watch_runs" });
    });
    socket.addEventListener("message", (message) => this.receive(message.data));
    socket.addEventListener("close", () => {
      if (this.socket !== socket) return;
      this.socket = null;
      if (this.stopped) return;
      this.onState("reconnecting");
      this.retry = setTimeout(() => this.connect(), this.backoff);
      this.backoff = Math.min(this.backoff * 2, MAX_BACKOFF_MS);
    });
  }

  send(message) {
    if (this.socket?.readyState === WebSocket.OPEN) this.socket.send(JSON.stringify(message));
  }

  sendSubscribe(run, fromSeq) {
    this.send({ op: "subscribe", run, from_seq: fromSeq });
  }

  receive(data) {
    let message;
    try {
      message = JSON.parse(data);
    } catch {
      return;
    }
    const subscription = message.run ? this.runs.get(message.run) : undefined;
    switch (message.type) {
      case "event": {
        if (!subscription) return;
        const seq = message.event.seq;
        if (seq < subscription.next) return; // already handed on (a re-subscribe's overlap)
        subscription.next = seq + 1;
        subscription.onEvent(message.event);
        return;
      }
      case "status":
        subscription?.onStatus(message.status);
        return;
      case "run":
        for (const watcher of this.watchers) watcher(message.row);
        return;
      case "error":
        if (subscription) subscription.onError(message.error);
        return;
      default:
    }
  }

  // Events of `run` from seq `fromSeq` on, then live; returns the unsubscribe.
  subscribe(run, { onEvent = () => {}, onStatus = () => {}, onError = () => {} }, fromSeq = 0) {
    const subscription = { next: fromSeq, onEvent, onStatus, onError };
    this.runs.set(run, subscription);
    this.sendSubscribe(run, fromSeq);
    return () => {
      if (this.runs.get(run) !== subscription) return;
      this.runs.delete(run);
      this.send({ op: "unsubscribe", run });
    };
  }

  // Every changed run-list row, as GET /v1/runs gives it; returns the unwatch.
  watchRuns(watcher) {
    this.watchers.add(watcher);
    if (this.watchers.size === 1) this.send({ op: "watch_runs" });
    return () => {
      this.watchers.delete(watcher);
      if (this.watchers.size === 0) this.send({ op: "unwatch_runs" });
    };
  }
}
