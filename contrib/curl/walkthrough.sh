#!/usr/bin/env bash
# A tour of salvor's HTTP API with nothing but curl (and python3 to pick
# fields out of JSON). Start a daemon first, in another terminal:
#
#   salvor serve --demo-tools
#
# then, from the repository root:
#
#   contrib/curl/walkthrough.sh
#
# Environment:
#   SALVOR_URL    the daemon (default http://127.0.0.1:8420)
#   SALVOR_TOKEN  the bearer token, when the daemon runs with --auth-token
#   SALVOR_BIN    the salvor command (default: salvor), used once in part 3
#   SALVOR_STORE  the daemon's store, when it is not the default one: part 3
#                 starts a run from the command line in that same store
#
# The six parts: a run start to finish, watched live; a run that stops at a
# gate and a person approves it; two runs whose write was cut short, one
# settled by the write's probe, one its probe cannot tell, which a person
# resolves; a graph run (research, draft, approve, publish) and a fork of it
# that may publish again only once someone says so; an agent asking a person
# a question, and one handing a task to a child agent; and an error, to show
# the envelope.
set -euo pipefail

URL="${SALVOR_URL:-http://127.0.0.1:8420}"
SALVOR_BIN="${SALVOR_BIN:-salvor}"
HERE="$(cd "$(dirname "$0")" && pwd)"
AGENTS="$HERE/../agents"
GRAPHS="$HERE/../graphs"

AUTH=()
if [[ -n "${SALVOR_TOKEN:-}" ]]; then
  AUTH=(-H "Authorization: Bearer $SALVOR_TOKEN")
fi

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

# api METHOD PATH [curl args...]: the JSON answer on stdout; fails on a 4xx/5xx
# after printing the error envelope.
api() {
  local method="$1" path="$2"
  shift 2
  curl -sS --fail-with-body "${AUTH[@]}" -X "$method" "$@" "$URL$path"
}

# pick EXPR: read JSON on stdin and print EXPR evaluated on it as `j`
# (strings bare, everything else as JSON).
pick() {
  python3 -c '
import json, sys
j = json.load(sys.stdin)
v = eval(sys.argv[1], {"j": j})
print(v if isinstance(v, str) else json.dumps(v))
' "$1"
}

# watch RUN [FROM_SEQ]: stream the run's events until the daemon sends the
# `end` frame (it closes the stream then), one line per event on stderr; the
# state the run rested at on stdout. -N: curl shows each frame as it lands.
read -r -d '' FRAMES_PY <<'PY' || true
import json, sys
kind = None
for line in sys.stdin:
    line = line.rstrip("\n")
    if line.startswith("event: "):
        kind = line[len("event: "):]
    elif line.startswith("data: "):
        data = json.loads(line[len("data: "):])
        if kind == "end":
            print("   end:", json.dumps(data["status"])[:160], file=sys.stderr)
            print(data["status"]["state"])
        else:
            event = data["event"]
            payload = event["payload"]
            by = f"settled by {payload['settled_by']}" if payload.get("settled_by") else ""
            print(f"   seq {data['seq']:>3}  {event['kind']}", payload.get("tool", ""), by, file=sys.stderr)
    elif not line:
        kind = None
PY
watch() {
  local run="$1" from="${2:-0}"
  curl -sS -N --fail-with-body "${AUTH[@]}" "$URL/v1/runs/$run/events?from_seq=$from" | python3 -c "$FRAMES_PY"
}

# after_write RUN: the seq after the run's refund intent (what its recovery records starts
# there), once the run rests. A run whose process died is anyone's to recover: the daemon may
# already be taking it over when this asks, and its stream ends once it rests.
read -r -d '' AFTER_WRITE_PY <<'PY' || true
import json, sys
for line in sys.stdin:
    if line.startswith("data: "):
        data = json.loads(line[len("data: "):])
        event = data.get("event", {})
        if event.get("kind") == "ToolCallRequested" and event["payload"].get("tool") == "issue_refund":
            print(data["seq"] + 1)
PY
after_write() {
  curl -sS -N --fail-with-body "${AUTH[@]}" "$URL/v1/runs/$1/events" | python3 -c "$AFTER_WRITE_PY" | head -n 1
}

expect() {
  if [[ "$1" != "$2" ]]; then
    echo "walkthrough: expected $2, got $1" >&2
    exit 1
  fi
}

say "0. Is the daemon there?"
api GET /v1/capabilities
echo

say "1. Register an agent (its TOML, as is) and run it"
AGENT=$(api POST /v1/agents -H 'Content-Type: application/toml' --data-binary @"$AGENTS/refund-desk.toml" | pick 'j["agent"]')
echo "agent $AGENT"
RUN=$(api POST /v1/runs -H 'Content-Type: application/json' \
  -d "{\"agent\": \"$AGENT\", \"input\": {\"invoice_id\": \"INV-1001\"}, \"labels\": {\"source\": \"walkthrough\"}}" \
  | pick 'j["run"]')
echo "run $RUN; its events, live:"
STATE=$(watch "$RUN")
expect "$STATE" completed
api GET "/v1/runs/$RUN" | pick '{k: j[k] for k in ("status", "event_count", "usage")}' | cut -c1-200

say "2. A gate: the run waits for a person's approval"
GATED=$(api POST /v1/agents -H 'Content-Type: application/toml' --data-binary @"$HERE/refund-with-approval.toml" | pick 'j["agent"]')
RUN=$(api POST /v1/runs -H 'Content-Type: application/json' \
  -d "{\"agent\": \"$GATED\", \"input\": {\"invoice_id\": \"INV-2002\"}}" | pick 'j["run"]')
echo "run $RUN:"
STATE=$(watch "$RUN")
expect "$STATE" suspended
echo "what it waits for:"
api GET "/v1/runs/$RUN" | pick 'j["status"]'
echo "an input the recorded schema rejects is refused, and nothing is recorded:"
api POST "/v1/runs/$RUN/resume" -H 'Content-Type: application/json' -d '{"input": {"approved": "yes"}}' || true
echo
NEXT=$(api GET "/v1/runs/$RUN/replay" | pick 'j["next_seq"]')
echo "approve it:"
api POST "/v1/runs/$RUN/resume" -H 'Content-Type: application/json' \
  -d '{"input": {"approved": true, "note": "checked by the walkthrough"}}'
echo
STATE=$(watch "$RUN" "$NEXT")
expect "$STATE" completed

say "3. A write cut short: its probe settles it, or a person does"
# A write (issue_refund) whose process died mid-call. The fault hook kills the
# `salvor run` process at exactly that instant; it writes to the daemon's
# store, and its demo tools to the same ledger as the daemon's (beside a SQLite
# store, unless SALVOR_DEMO_EFFECTS names one). issue_refund declares a probe,
# lookup_refund, which looks the invoice's refund up in that ledger. A fresh
# invoice each time: a second refund of one invoice copies the first.
killed_in() {
  SALVOR_FAULT_KILL_IN_TOOL="$1" "$SALVOR_BIN" run "$AGENTS/refund-desk.toml" \
    --input "{\"invoice_id\": \"$2\"}" --json 2>/dev/null | head -n 1 | pick 'j["run"]' || true
}
RUN=$(killed_in issue_refund "INV-3003-$RANDOM$RANDOM")
if [[ -z "$RUN" ]]; then
  echo "walkthrough: could not start a run with $SALVOR_BIN; is it installed, and SALVOR_STORE the daemon's store?" >&2
  exit 1
fi
echo "run $RUN, killed inside issue_refund after the refund went out."
NEXT=$(after_write "$RUN")
echo "resume (or the daemon, taking over a run whose process died, already did): the probe finds"
echo "the refund, and its answer becomes the write's output:"
api POST "/v1/runs/$RUN/resume"
echo
STATE=$(watch "$RUN" "$NEXT")
expect "$STATE" completed

INVOICE="INV-3004-$RANDOM$RANDOM"
RUN=$(killed_in issue_refund:sent "$INVOICE")
echo "run $RUN, killed after the bank was sent the refund, before it answered:"
NEXT=$(after_write "$RUN")
echo "resume: the probe cannot tell whether the refund went out, so the run waits for a person:"
api POST "/v1/runs/$RUN/resume"
echo
STATE=$(watch "$RUN" "$NEXT")
expect "$STATE" needs_reconciliation
echo "the reconciliation queue: the write, its key, and what the probe answered:"
api GET "/v1/reconciliations" | pick '[{"run": i["run"], "tool": i["intent"]["tool"], "key": i["idempotency_key"], "probe": i["probe"]} for i in j["reconciliations"] if i["run"] == "'"$RUN"'"]'
AMOUNT=$(api GET "/v1/runs/$RUN" | pick 'j["pending"]["input"]["amount_cents"]')
NEXT=$(api GET "/v1/runs/$RUN/replay" | pick 'j["next_seq"]')
echo "having checked the payment provider: the refund went out. Record what it returned:"
api POST "/v1/runs/$RUN/resolve" -H 'Content-Type: application/json' \
  -d "{\"output\": {\"refund_id\": \"rf_checked_by_hand\", \"invoice_id\": \"$INVOICE\", \"amount_cents\": $AMOUNT}}"
echo
echo "the daemon drives it on from the recorded output, performing no refund again:"
STATE=$(watch "$RUN" "$NEXT")
expect "$STATE" completed

say "4. A graph: research, draft, an editor approves, publish; then a fork from publish"
for name in researcher drafter; do
  api POST /v1/agents -H 'Content-Type: application/toml' --data-binary @"$AGENTS/$name.toml" >/dev/null
done
GRAPH=$(api POST /v1/graphs -H 'Content-Type: application/json' --data-binary @"$GRAPHS/publish.json" | pick 'j["graph"]')
echo "graph $GRAPH"
RUN=$(api POST /v1/graph-runs -H 'Content-Type: application/json' \
  -d "{\"graph_hash\": \"$GRAPH\", \"input\": $(cat "$GRAPHS/publish.input.json")}" | pick 'j["run"]')
echo "graph run $RUN, its events, live:"
STATE=$(watch "$RUN")
expect "$STATE" suspended
echo "where the walk is:"
api GET "/v1/runs/$RUN/graph" | pick '{"current_node": j["current_node"], "nodes": [(n["node"], n["state"]) for n in j["nodes"]]}'
echo "an approval the gate's approval_schema rejects is refused, and nothing is recorded:"
api POST "/v1/runs/$RUN/resume" -H 'Content-Type: application/json' -d '{"input": {"approved": "yes"}}' || true
echo
NEXT=$(api GET "/v1/runs/$RUN/replay" | pick 'j["next_seq"]')
api POST "/v1/runs/$RUN/resume" -H 'Content-Type: application/json' -d '{"input": {"approved": true}}'
echo
STATE=$(watch "$RUN" "$NEXT")
expect "$STATE" completed
api GET "/v1/runs/$RUN/graph" | pick '[(n["node"], n["state"], n.get("branch_case") or n.get("reason", "")) for n in j["nodes"]]'
echo "fork it from publish: the fork would publish again (publish_post is a write with no key), so it is refused:"
api POST "/v1/runs/$RUN/fork" -H 'Content-Type: application/json' -d '{"from_node": "publish"}' || true
echo
WRITES=$(api POST "/v1/runs/$RUN/fork" -H 'Content-Type: application/json' \
  -d '{"from_node": "publish", "dry_run": true}' | pick 'j["unacknowledged_writes"]')
echo "acknowledge the writes at $WRITES, and the fork runs from publish (the prefix is copied, nothing in it runs again):"
CHILD=$(api POST "/v1/runs/$RUN/fork" -H 'Content-Type: application/json' \
  -d "{\"from_node\": \"publish\", \"acknowledge_writes\": $WRITES}" | pick 'j["run"]')
STATE=$(watch "$CHILD")
expect "$STATE" completed
echo "the origin's forks (derived from the forks' own heads):"
api GET "/v1/runs/$RUN/forks"
echo

say "5. Flow tools: an agent asks a person a question, and one hands a task to another"
ASK=$(api POST /v1/agents -H 'Content-Type: application/toml' --data-binary @"$AGENTS/ask-operator.toml" | pick 'j["agent"]')
RUN=$(api POST /v1/runs -H 'Content-Type: application/json' \
  -d "{\"agent\": \"$ASK\", \"input\": {\"question\": \"Which rollout should the migration use?\", \"type\": \"select\", \"options\": [\"blue-green\", \"rolling\"]}}" \
  | pick 'j["run"]')
STATE=$(watch "$RUN")
expect "$STATE" suspended
echo "the question, and the answer's schema:"
api GET "/v1/runs/$RUN" | pick '{"reason": j["status"]["reason"], "answer": j["status"]["input_schema"]["properties"]["answer"]}'
echo "an answer that is not one of the options is refused, and nothing is recorded:"
api POST "/v1/runs/$RUN/resume" -H 'Content-Type: application/json' -d '{"input": {"answer": "canary"}}' || true
echo
NEXT=$(api GET "/v1/runs/$RUN/replay" | pick 'j["next_seq"]')
api POST "/v1/runs/$RUN/resume" -H 'Content-Type: application/json' -d '{"input": {"answer": "rolling"}}'
echo
STATE=$(watch "$RUN" "$NEXT")
expect "$STATE" completed
echo "a child agent (a markdown file, typed outputs) and a parent that delegates to it:"
api POST /v1/agents -H 'Content-Type: text/markdown' --data-binary @"$AGENTS/fact-checker.md" >/dev/null
CHIEF=$(api POST /v1/agents -H 'Content-Type: application/toml' --data-binary @"$AGENTS/editor-in-chief.toml" | pick 'j["agent"]')
RUN=$(api POST /v1/runs -H 'Content-Type: application/json' \
  -d "{\"agent\": \"$CHIEF\", \"input\": {\"agent\": \"fact-checker\", \"task\": \"Check this claim.\", \"inputs\": {\"claim\": \"Tides follow the Moon.\"}}}" \
  | pick 'j["run"]')
STATE=$(watch "$RUN")
expect "$STATE" completed
CHILD=$(api GET "/v1/runs/$RUN/children" | pick 'j["children"][0]["run"]')
echo "its one child, $CHILD, names its parent and finished with typed outputs:"
api GET "/v1/runs/$CHILD" | pick '{"parent": j["parent"], "output": j["status"]["output"]}'

say "6. Every error has one shape"
api GET /v1/runs/00000000-0000-4000-8000-000000000000 || true
echo
echo
echo "done: the runs above are in the daemon's store; GET $URL/v1/runs lists them."
