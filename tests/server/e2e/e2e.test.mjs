// End-to-end: `hyspec serve` driven by the official `openai` npm client (pinned in package.json).
// Run by ctest after `npm ci` in this folder:  node --test e2e.test.mjs
// Environment: HYSPEC_BINARY (the hyspec executable), HYSPEC_FIXTURES or HYSPEC_DEFAULT_FIXTURES.
import { spawn } from 'node:child_process';
import assert from 'node:assert/strict';
import path from 'node:path';
import { after, before, test } from 'node:test';

let OpenAI;
try {
  ({ default: OpenAI } = await import('openai'));
} catch (e) {
  throw new Error(`the openai package is not installed here (run \`npm ci\` in ${import.meta.dirname}): ${e.message}`);
}

const binary = process.env.HYSPEC_BINARY;
const fixtures = process.env.HYSPEC_FIXTURES || process.env.HYSPEC_DEFAULT_FIXTURES;
assert.ok(binary, 'HYSPEC_BINARY is not set');
assert.ok(fixtures, 'HYSPEC_FIXTURES is not set');
const model = path.join(fixtures, 'qwen35-tiny', 'qwen35-tiny-q8_0.gguf');
const apiKey = 'e2e-secret';

let server;
let output = '';
let baseURL;
let client;

before(async () => {
  server = spawn(binary, ['serve', '-m', model, '--port', '0', '--api-key', apiKey, '--threads', '1', '--parallel', '2']);
  server.stdout.on('data', (d) => { output += d; });
  server.stderr.on('data', (d) => { output += d; });
  const deadline = Date.now() + 60_000;
  while (Date.now() < deadline) {
    const m = output.match(/listening on (http:\/\/[^\s]+)/);
    if (m) {
      try {
        const r = await fetch(`${m[1]}/health`);
        if (r.status === 200) {
          baseURL = m[1];
          break;
        }
      } catch { /* not listening yet */ }
    }
    if (server.exitCode !== null) break;
    await new Promise((r) => setTimeout(r, 50));
  }
  assert.ok(baseURL, `hyspec serve did not become ready:\n${output}`);
  client = new OpenAI({ baseURL: `${baseURL}/v1`, apiKey, maxRetries: 0, timeout: 60_000 });
});

after(async () => {
  if (!server || server.exitCode !== null) return;
  const exited = new Promise((resolve) => server.on('exit', (code, signal) => resolve({ code, signal })));
  server.kill('SIGTERM');
  const { code, signal } = await exited;
  assert.equal(code, 0, `hyspec serve exited with ${code ?? signal} after SIGTERM:\n${output}`);
});

const noThinking = { chat_template_kwargs: { enable_thinking: false } };
const user = (content) => [{ role: 'user', content }];

test('models.list reports the loaded model', async () => {
  const page = await client.models.list();
  assert.equal(page.data.length, 1);
  assert.equal(page.data[0].id, 'qwen35-tiny-q8_0');
});

test('chat completion', async () => {
  const r = await client.chat.completions.create({
    model: 'whatever', messages: user('Hello there'), max_tokens: 8, temperature: 0, ...noThinking,
  });
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.model, 'qwen35-tiny-q8_0');
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(typeof r.choices[0].message.content, 'string');
  assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason));
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
  assert.ok(r.usage.completion_tokens >= 1 && r.usage.completion_tokens <= 8);
});

test('streaming chat gives the same text as the unstreamed reply, then usage', async () => {
  const params = { model: 'm', messages: user('Tell me a story'), max_tokens: 16, temperature: 0, ignore_eos: true, ...noThinking };
  const whole = await client.chat.completions.create(params);
  const stream = await client.chat.completions.create({ ...params, stream: true, stream_options: { include_usage: true } });
  let content = '';
  let finish = null;
  let usage = null;
  let chunks = 0;
  for await (const chunk of stream) {
    chunks += 1;
    assert.equal(chunk.object, 'chat.completion.chunk');
    if (chunk.usage) usage = chunk.usage;
    for (const choice of chunk.choices) {
      content += choice.delta.content ?? '';
      if (choice.finish_reason) finish = choice.finish_reason;
    }
  }
  assert.ok(chunks > 3, `only ${chunks} chunks`);
  assert.equal(content, whole.choices[0].message.content);
  assert.equal(finish, 'length');
  assert.equal(usage.completion_tokens, 16);
  assert.ok(usage.hyspec, 'usage carries the hyspec draft statistics');
});

test('reasoning goes to reasoning_content when thinking is on', async () => {
  const r = await client.chat.completions.create({
    model: 'm', messages: user('Think first'), max_tokens: 6, temperature: 0, ignore_eos: true,
  });
  const msg = r.choices[0].message;
  // The prompt opened <think>: a reply cut short is all reasoning.
  assert.equal(typeof msg.reasoning_content, 'string');
  assert.equal(msg.content, '');
});

test('completion, plain and streamed', async () => {
  const params = { model: 'm', prompt: 'Once upon a time', max_tokens: 10, temperature: 0, ignore_eos: true };
  const r = await client.completions.create(params);
  assert.equal(r.object, 'text_completion');
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.usage.completion_tokens, 10);
  let text = '';
  for await (const chunk of await client.completions.create({ ...params, stream: true })) text += chunk.choices[0]?.text ?? '';
  assert.equal(text, r.choices[0].text);
});

test('logprobs', async () => {
  const r = await client.chat.completions.create({
    model: 'm', messages: user('Hi'), max_tokens: 4, temperature: 0, ignore_eos: true, logprobs: true, top_logprobs: 2, ...noThinking,
  });
  const lp = r.choices[0].logprobs.content;
  assert.equal(lp.length, 4);
  for (const t of lp) {
    assert.ok(t.logprob <= 0);
    assert.equal(t.top_logprobs.length, 2);
  }
});

test('tools round trip: a history with tool calls and results is accepted and rendered', async () => {
  const tools = [{
    type: 'function',
    function: {
      name: 'get_weather',
      description: 'Current weather in a city',
      parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
    },
  }];
  const messages = [
    { role: 'system', content: 'You are terse.' },
    { role: 'user', content: 'Weather in Paris?' },
    {
      role: 'assistant',
      content: null,
      tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: JSON.stringify({ city: 'Paris' }) } }],
    },
    { role: 'tool', tool_call_id: 'call_1', content: 'sunny, 21 C' },
  ];
  const withTools = await client.chat.completions.create({ model: 'm', messages, tools, max_tokens: 4, temperature: 0 });
  assert.equal(withTools.choices[0].message.role, 'assistant');
  const hidden = await client.chat.completions.create({ model: 'm', messages, tools, tool_choice: 'none', max_tokens: 4, temperature: 0 });
  assert.ok(withTools.usage.prompt_tokens > hidden.usage.prompt_tokens + 20, 'the tool schema is rendered into the prompt');
  const streamed = await client.chat.completions.create({ model: 'm', messages, tools, max_tokens: 4, temperature: 0, stream: true });
  let n = 0;
  for await (const _ of streamed) n += 1;
  assert.ok(n >= 2);
});

test('errors come back as the client\'s typed errors', async () => {
  await assert.rejects(
    client.chat.completions.create({ model: 'm', messages: user('x'), temperature: -1 }),
    (e) => e instanceof OpenAI.BadRequestError && e.status === 400 && e.param === 'temperature',
  );
  await assert.rejects(
    client.chat.completions.create({ model: 'm', messages: user('x'), n: 2 }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'n',
  );
  await assert.rejects(
    client.completions.create({ model: 'm', prompt: Array.from({ length: 5000 }, () => 42) }),
    (e) => e instanceof OpenAI.BadRequestError && e.code === 'context_length_exceeded' && /too many/.test(e.message),
  );
  await assert.rejects(
    client.chat.completions.create({ model: 'm', messages: [{ role: 'wizard', content: 'x' }] }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'messages',
  );
  const stranger = new OpenAI({ baseURL: `${baseURL}/v1`, apiKey: 'wrong', maxRetries: 0 });
  await assert.rejects(stranger.models.list(), (e) => e instanceof OpenAI.AuthenticationError && e.status === 401);
  await assert.rejects(client.models.retrieve('no-such-model'), (e) => e instanceof OpenAI.NotFoundError);
});
