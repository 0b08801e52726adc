// llama.cpp's side of bench/inference.py: greedy decoding of a GGUF file with node-llama-cpp's prebuilt CPU build.
//
//   cd bench/llamacpp && npm i -E node-llama-cpp@3.21.1     (once; node_modules is git-ignored)
//   node bench/llamacpp/decode.mjs MODEL.gguf THREADS
//
// Reads one JSON request per line on stdin, {"ids": [prompt token ids], "tokens": N}, evaluates the ids
// (the prompt exactly as tunestudio tokenised it) and decodes greedily up to N tokens, then answers one
// JSON line: {"ttft_ms", "tokens_per_s", "ids"}. TTFT: evaluate called -> first token; tokens/s:
// (tokens - 1) / (last token - first token). The first line it writes is {"ready": true, ...} once loaded.
import {createInterface} from "node:readline";
import {getLlama} from "node-llama-cpp";

const [modelPath, threadsArg] = process.argv.slice(2);
const threads = Number(threadsArg || 2);
const llama = await getLlama({gpu: false, build: "never"});
const started = performance.now();
const model = await llama.loadModel({modelPath});
const context = await model.createContext({contextSize: 1024, threads});
const sequence = context.getSequence();
process.stdout.write(JSON.stringify({ready: true, load_ms: performance.now() - started, threads}) + "\n");

for await (const line of createInterface({input: process.stdin})) {
  if (!line.trim()) continue;
  const request = JSON.parse(line);
  const ids = [];
  const stamps = [];
  const begin = performance.now();
  for await (const token of sequence.evaluate(request.ids, {temperature: 0})) {
    stamps.push(performance.now());
    ids.push(token);
    if (ids.length >= request.tokens) break;
  }
  await sequence.clearHistory();
  const n = stamps.length;
  process.stdout.write(JSON.stringify({
    ttft_ms: stamps[0] - begin,
    tokens_per_s: n > 1 ? (n - 1) / ((stamps[n - 1] - stamps[0]) / 1000) : 0,
    ids,
  }) + "\n");
}
await context.dispose();
await model.dispose();
