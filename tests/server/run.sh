#!/usr/bin/env bash
# Starts dsinfer-server on a free loopback port with the CLI's default model, runs the
# server tests against it — curl, the official OpenAI Node.js SDK (tests/server/
# openai_sdk_test.mjs), the pytest suite (tests/server/test_server.py: outputs against
# dsinfer-cli, a 16-client load test, disconnects, limits, malformed HTTP/JSON) — then
# stops it with SIGTERM and checks that it exits cleanly (under ASan: without leaks).
#
# Usage: tests/server/run.sh BUILD_DIR [asan]
#   BUILD_DIR  a CMake build tree with bin/dsinfer-server and bin/dsinfer-cli
# Environment: DSI_CLI (reference CLI; default BUILD_DIR/bin/dsinfer-cli),
#   DSI_NODE_DIR (where setup-deps installed the npm package openai; default .cache/node),
#   DSI_LOAD_CLIENTS / DSI_LOAD_PER_CLIENT (load test size, default 16 x 4).
# Last line: "RESULT: N passed, N failed, N skipped".
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "$1" && pwd)
mode=${2:-}
server=$build/bin/dsinfer-server
cli=${DSI_CLI:-$build/bin/dsinfer-cli}
node_dir=${DSI_NODE_DIR:-$root/.cache/node}
py=/usr/bin/python3
passed=0 failed=0 skipped=0
pass() { echo "ok - $1"; passed=$((passed + 1)); }
fail() { echo "FAIL - $1"; failed=$((failed + 1)); }
skip() { echo "skip - $1"; skipped=$((skipped + 1)); }
finish() { echo "RESULT: $passed passed, $failed failed, $skipped skipped"; [ "$failed" -eq 0 ]; exit; }

if [ ! -x "$server" ]; then
  fail "dsinfer-server is not built in $build (libmicrohttpd-dev and libjansson-dev are needed)"
  finish
fi
model=$("$cli" -p x -n 0 2>&1 >/dev/null | sed -n 's/.*using the built-in default model //p')
if [ -z "$model" ] || [ ! -f "$model" ]; then
  fail "cannot find the CLI's default model"
  finish
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
key=sk-dsinfer-test
queue=12   # 4 slots + 12 waiting = the 16 load-test clients; the 429 test fills exactly that
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:exitcode=23}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
"$server" -m "$model" --port 0 --port-file "$tmp/port" --log "$tmp/server.log" --log-level debug \
  -t 2 --parallel 4 --queue $queue --max-body 65536 --max-tokens 4000 --ctx 4096 --api-key "$key" \
  2>"$tmp/server.stderr" &
pid=$!
for _ in $(seq 1 600); do
  [ -s "$tmp/port" ] && break
  kill -0 $pid 2>/dev/null || break
  sleep 0.1
done
if [ ! -s "$tmp/port" ]; then
  fail "the server did not start: $(tail -5 "$tmp/server.log" "$tmp/server.stderr" 2>/dev/null)"
  kill $pid 2>/dev/null
  finish
fi
port=$(cat "$tmp/port")
url=http://127.0.0.1:$port
echo "server: pid $pid, $url, model $model${mode:+ ($mode)}"

# ---- curl ------------------------------------------------------------------------------------
n=24
prompt="The quick brown fox"
want=$("$cli" -p "$prompt" -n $n --temp 0 -t 2 2>/dev/null; echo x)
want=${want%$'\nx'}
chat_want=$(printf '%s\n/quit\n' "$prompt" | "$cli" --chat -n $n --temp 0 -t 2 2>/dev/null; echo x)
chat_want=${chat_want%$'\nx'}
auth=(-H "Authorization: Bearer $key")
out=$(curl -s -w '\n%{http_code}' "$url/health")
[ "${out##*$'\n'}" = 200 ] && [[ "$out" == *'"status":"ok"'* ]] && pass "curl: GET /health" || fail "curl: GET /health: $out"
out=$(curl -s "${auth[@]}" "$url/v1/models")
[[ "$out" == *'"object":"list"'* ]] && pass "curl: GET /v1/models" || fail "curl: GET /v1/models: $out"
# curl -d sends application/x-www-form-urlencoded: the body is JSON all the same
body=$("$py" -c 'import json,sys; print(json.dumps({"model":"m","prompt":sys.argv[1],"max_tokens":int(sys.argv[2]),"temperature":0}))' "$prompt" $n)
got=$(curl -s "${auth[@]}" -d "$body" "$url/v1/completions" | "$py" -c 'import json,sys; sys.stdout.write(json.load(sys.stdin)["choices"][0]["text"])')
[ "$got" = "$want" ] && pass "curl: POST /v1/completions equals dsinfer-cli" || fail "curl: completion '$got' != CLI '$want'"
cbody=$("$py" -c 'import json,sys; print(json.dumps({"model":"m","messages":[{"role":"user","content":sys.argv[1]}],"max_tokens":int(sys.argv[2]),"temperature":0,"stream":True}))' "$prompt" $n)
sse=$(curl -sN "${auth[@]}" -H 'Content-Type: application/json' -d "$cbody" "$url/v1/chat/completions")
got=$(printf '%s' "$sse" | "$py" -c '
import json, sys
t = ""
for line in sys.stdin.read().split("\n"):
    if line.startswith("data: ") and line != "data: [DONE]":
        e = json.loads(line[6:])
        t += e["choices"][0]["delta"].get("content", "") if e["choices"] else ""
sys.stdout.write(t)')
[ "$got" = "$chat_want" ] && [[ "$sse" == *"data: [DONE]"* ]] && pass "curl: streamed chat equals dsinfer-cli --chat" \
  || fail "curl: streamed chat '$got' != CLI '$chat_want'"
out=$(curl -s "${auth[@]}" -w '\n%{http_code} %{content_type}' -d '{"model": "m", "prompt": ' "$url/v1/completions")
[[ "${out##*$'\n'}" == "400 application/json" ]] && [[ "$out" == *'"error"'* ]] && pass "curl: malformed JSON is a 400 JSON error" \
  || fail "curl: malformed JSON: $out"

# ---- the OpenAI Node.js SDK ----------------------------------------------------------------------
if ! command -v node >/dev/null 2>&1; then
  skip "OpenAI Node SDK: node is not installed (scripts/setup-deps.sh installs nodejs)"
elif [ ! -f "$node_dir/node_modules/openai/package.json" ]; then
  skip "OpenAI Node SDK: npm package openai not found in $node_dir (scripts/setup-deps.sh installs it)"
else
  "$py" -c 'import json,sys; json.dump({"model":sys.argv[1],"prompt":sys.argv[2],"n":int(sys.argv[3]),"completion":sys.argv[4],"chat":sys.argv[5]}, open(sys.argv[6],"w"))' \
    "$(basename "$model" .gguf)" "$prompt" $n "$want" "$chat_want" "$tmp/expect.json"
  # ES modules resolve packages next to the script: run a copy inside the npm prefix
  cp "$root/tests/server/openai_sdk_test.mjs" "$node_dir/openai_sdk_test.mjs"
  DSI_EXPECT=$tmp/expect.json DSI_SERVER_URL=$url DSI_API_KEY=$key timeout 600 node "$node_dir/openai_sdk_test.mjs" >"$tmp/node.log" 2>&1
  cat "$tmp/node.log"
  np=$(grep -c '^ok - ' "$tmp/node.log")
  nf=$(grep -c '^not ok - ' "$tmp/node.log")
  passed=$((passed + np)); failed=$((failed + nf))
  [ "$np" -gt 0 ] || fail "OpenAI Node SDK: no check ran"
fi

# ---- pytest ---------------------------------------------------------------------------------------
DSI_SERVER_URL=$url DSI_SERVER_LOG=$tmp/server.log DSI_API_KEY=$key DSI_CLI=$cli DSI_MAX_BODY=65536 \
DSI_MAX_QUEUE=$queue timeout 1800 "$py" -m pytest -q -rs -p no:cacheprovider "$root/tests/server/test_server.py" >"$tmp/pytest.log" 2>&1
tail -40 "$tmp/pytest.log"
summary=$(tail -n1 "$tmp/pytest.log")
for kind in passed failed skipped error errors; do
  v=$(printf '%s' "$summary" | grep -oE "[0-9]+ $kind" | grep -oE '^[0-9]+')
  case $kind in
    passed) passed=$((passed + ${v:-0})) ;;
    skipped) skipped=$((skipped + ${v:-0})) ;;
    *) failed=$((failed + ${v:-0})) ;;
  esac
done
printf '%s' "$summary" | grep -qE '[0-9]+ passed' || fail "pytest did not run: $summary"

# ---- shutdown --------------------------------------------------------------------------------------
# a stream in flight when SIGTERM arrives ends with a shutting_down error event
lbody=$("$py" -c 'import json; print(json.dumps({"model":"m","prompt":"A long story","max_tokens":3000,"temperature":0,"stream":True}))')
curl -sN "${auth[@]}" -d "$lbody" "$url/v1/completions" >"$tmp/inflight.txt" 2>/dev/null &
cpid=$!
for _ in $(seq 1 300); do
  grep -q '"text"' "$tmp/inflight.txt" 2>/dev/null && break
  sleep 0.1
done
kill -TERM $pid
for _ in $(seq 1 600); do kill -0 $pid 2>/dev/null || break; sleep 0.1; done
if kill -0 $pid 2>/dev/null; then
  fail "the server did not stop within 60 s of SIGTERM"
  kill -KILL $pid
fi
wait $pid
rc=$?
grep -q 'info stopped' "$tmp/server.log" && [ $rc -eq 0 ] && pass "SIGTERM: orderly shutdown, exit 0" \
  || fail "shutdown: exit status $rc: $(tail -3 "$tmp/server.log")"
wait $cpid
grep -q '"code":"shutting_down"' "$tmp/inflight.txt" && grep -q 'data: \[DONE\]' "$tmp/inflight.txt" \
  && pass "SIGTERM mid-stream: the client gets a shutting_down error event and [DONE]" \
  || fail "SIGTERM mid-stream: $(tail -c 300 "$tmp/inflight.txt")"
if [ "$mode" = asan ]; then
  if grep -qE 'ERROR: (Leak|Address)Sanitizer|runtime error:' "$tmp/server.stderr"; then
    fail "sanitizers: $(grep -m1 -A12 -E 'ERROR|runtime error' "$tmp/server.stderr")"
  else
    pass "ASan/UBSan: no error and no leak in the server at shutdown"
  fi
fi
if [ -s "$tmp/server.stderr" ] && [ "$mode" != asan ]; then
  fail "the server wrote to stderr although --log was given: $(head -3 "$tmp/server.stderr")"
fi
grep -c ' POST /v1/' "$tmp/server.log" | sed 's/^/server log: POST requests served: /'
finish
