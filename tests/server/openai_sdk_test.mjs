// dsinfer-server through the official OpenAI Node.js SDK (npm "openai"): model list,
// chat completions and completions, streaming and not, against expected texts made by
// dsinfer-cli (tests/server/run.sh writes them to $DSI_EXPECT). Prints "ok - name" or
// "not ok - name: why" per check; exits non-zero on any failure.
import OpenAI from 'openai';
import { readFileSync } from 'node:fs';

const exp = JSON.parse(readFileSync(process.env.DSI_EXPECT, 'utf8'));
const client = new OpenAI({ baseURL: process.env.DSI_SERVER_URL + '/v1', apiKey: process.env.DSI_API_KEY, maxRetries: 0 });
let failed = 0;

async function check(name, fn) {
  try {
    await fn();
    console.log(`ok - ${name}`);
  } catch (e) {
    failed++;
    console.log(`not ok - ${name}: ${e && e.stack ? e.stack : e}`);
  }
}

function eq(a, b, what) {
  if (a !== b) throw new Error(`${what}: got ${JSON.stringify(a)}, want ${JSON.stringify(b)}`);
}

const chatReq = { model: exp.model, messages: [{ role: 'user', content: exp.prompt }], max_tokens: exp.n, temperature: 0 };
const complReq = { model: exp.model, prompt: exp.prompt, max_tokens: exp.n, temperature: 0 };

await check('models.list and models.retrieve', async () => {
  const ids = [];
  for await (const m of client.models.list()) ids.push(m.id);
  eq(JSON.stringify(ids), JSON.stringify([exp.model]), 'model ids');
  const one = await client.models.retrieve(exp.model);
  eq(one.id, exp.model, 'retrieved id');
});

await check('chat.completions.create', async () => {
  const r = await client.chat.completions.create(chatReq);
  eq(r.object, 'chat.completion', 'object');
  eq(r.choices[0].message.role, 'assistant', 'role');
  eq(r.choices[0].message.content, exp.chat, 'content');
  eq(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens, 'usage');
});

await check('chat.completions.create stream', async () => {
  const stream = await client.chat.completions.create({ ...chatReq, stream: true, stream_options: { include_usage: true } });
  let text = '', chunks = 0, finish = null, usage = null;
  for await (const c of stream) {
    if (c.usage) usage = c.usage;
    if (!c.choices.length) continue;
    const d = c.choices[0].delta;
    if (d.content) { text += d.content; chunks++; }
    if (c.choices[0].finish_reason) finish = c.choices[0].finish_reason;
  }
  eq(text, exp.chat, 'streamed content');
  if (chunks < 2) throw new Error(`only ${chunks} content chunks`);
  if (finish !== 'length' && finish !== 'stop') throw new Error(`finish_reason ${finish}`);
  if (!usage || usage.completion_tokens < 1) throw new Error('no usage chunk');
});

await check('chat.completions.stream helper (finalChatCompletion)', async () => {
  const runner = client.chat.completions.stream(chatReq);
  const final = await runner.finalChatCompletion();
  eq(final.choices[0].message.content, exp.chat, 'final content');
});

await check('completions.create', async () => {
  const r = await client.completions.create(complReq);
  eq(r.object, 'text_completion', 'object');
  eq(r.choices[0].text, exp.completion, 'text');
});

await check('completions.create stream', async () => {
  const stream = await client.completions.create({ ...complReq, stream: true });
  let text = '';
  for await (const c of stream) text += c.choices[0].text;
  eq(text, exp.completion, 'streamed text');
});

await check('a bad request raises BadRequestError (400) with the server message', async () => {
  try {
    await client.chat.completions.create({ ...chatReq, n: 2 });
  } catch (e) {
    if (!(e instanceof OpenAI.BadRequestError)) throw new Error(`wrong error class ${e && e.constructor && e.constructor.name}`);
    eq(e.status, 400, 'status');
    if (!String(e.message).includes("'n' must be 1")) throw new Error(`message ${e.message}`);
    return;
  }
  throw new Error('no error raised');
});

await check('a wrong API key raises AuthenticationError (401)', async () => {
  const other = new OpenAI({ baseURL: process.env.DSI_SERVER_URL + '/v1', apiKey: 'wrong-key', maxRetries: 0 });
  try {
    await other.models.list();
  } catch (e) {
    if (!(e instanceof OpenAI.AuthenticationError)) throw new Error(`wrong error class ${e && e.constructor && e.constructor.name}`);
    return;
  }
  throw new Error('no error raised');
});

await check('aborting a stream (AbortController) ends it early', async () => {
  const ac = new AbortController();
  const stream = await client.completions.create({ ...complReq, max_tokens: 2000, stream: true }, { signal: ac.signal });
  let n = 0;
  try {
    for await (const c of stream) { if (++n === 3) ac.abort(); }
  } catch (e) {
    if (!(e instanceof OpenAI.APIUserAbortError) && e.name !== 'AbortError') throw e;
  }
  if (n >= 200) throw new Error(`${n} chunks: the abort did not end the stream`);
});

process.exit(failed ? 1 : 0);
