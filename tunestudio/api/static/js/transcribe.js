// A speech-to-text job's panel (issue 45): record from the microphone or pick a recording, and read the base
// model's and the fine-tuned model's transcripts side by side (POST /v1/audio/transcriptions, once each).
// Chromium records WebM/Opus, which the server's decoder (libsndfile) does not read: the recording is decoded by the
// browser's own AudioContext and encoded here as 16-bit PCM WAV, mono, at the recording's rate.

import {errorText, transcribe} from "./api.js";
import {el, replaceKids} from "./util.js";

/** Float32 mono samples at `rate` as a 16-bit PCM WAV file. */
export function wavBlob(samples, rate) {
  const buffer = new ArrayBuffer(44 + 2 * samples.length);
  const view = new DataView(buffer);
  const text = (at, s) => [...s].forEach((c, i) => view.setUint8(at + i, c.charCodeAt(0)));
  text(0, "RIFF"); view.setUint32(4, 36 + 2 * samples.length, true); text(8, "WAVE");
  text(12, "fmt "); view.setUint32(16, 16, true); view.setUint16(20, 1, true); view.setUint16(22, 1, true);
  view.setUint32(24, rate, true); view.setUint32(28, 2 * rate, true); view.setUint16(32, 2, true);
  view.setUint16(34, 16, true); text(36, "data"); view.setUint32(40, 2 * samples.length, true);
  samples.forEach((s, i) => view.setInt16(44 + 2 * i, Math.max(-1, Math.min(1, s)) * 0x7fff, true));
  return new Blob([buffer], {type: "audio/wav"});
}

async function toWav(recorded) {
  const context = new AudioContext();
  try {
    const audio = await context.decodeAudioData(await recorded.arrayBuffer());
    const mono = new Float32Array(audio.length);
    for (let c = 0; c < audio.numberOfChannels; c++) {
      audio.getChannelData(c).forEach((v, i) => { mono[i] += v / audio.numberOfChannels; });
    }
    return wavBlob(mono, audio.sampleRate);
  } finally {
    context.close();
  }
}

export function transcribePanel(id) {
  const pick = el("input", {type: "file", id: "speech-file", accept: "audio/*,.wav,.flac,.mp3,.ogg"});
  const record = el("button", {type: "button", class: "button", id: "speech-record"}, "Record");
  const stop = el("button", {type: "button", class: "button", id: "speech-stop", disabled: true}, "Stop");
  const go = el("button", {type: "button", class: "button primary", id: "speech-transcribe", disabled: true},
    "Transcribe with both");
  const player = el("audio", {controls: true, id: "speech-player", hidden: true});
  const status = el("p", {class: "muted small", id: "speech-status", role: "status"});
  const side = (who) => el("div", {class: "chat-side", dataset: {model: who}},
    el("h3", {}, who === "base" ? "Base model" : "Fine-tuned"), el("pre", {class: "speech-text", id: `speech-${who}`}, "–"));
  const columns = el("div", {class: "chat-columns two"}, side("base"), side("tuned"));
  let clip = null, name = "recording.wav", recorder = null, chunks = [];

  const use = (blob, fileName) => {
    clip = blob;
    name = fileName;
    player.src = URL.createObjectURL(blob);
    player.hidden = false;
    go.disabled = false;
  };
  pick.addEventListener("change", () => { if (pick.files.length) use(pick.files[0], pick.files[0].name); });
  record.addEventListener("click", async () => {
    try {
      const stream = await navigator.mediaDevices.getUserMedia({audio: true});
      recorder = new MediaRecorder(stream);
      chunks = [];
      recorder.addEventListener("dataavailable", (e) => chunks.push(e.data));
      recorder.addEventListener("stop", async () => {
        stream.getTracks().forEach((t) => t.stop());
        try {
          use(await toWav(new Blob(chunks, {type: recorder.mimeType})), "recording.wav");
          status.textContent = "Recorded: transcribe it, or record again.";
        } catch (err) { status.textContent = `The recording could not be read: ${err.message}`; }
      });
      recorder.start();
      record.disabled = true;
      stop.disabled = false;
      status.textContent = "Recording… press Stop when done.";
    } catch (err) { status.textContent = `No microphone: ${err.message}`; }
  });
  stop.addEventListener("click", () => { recorder?.stop(); stop.disabled = true; record.disabled = false; });
  go.addEventListener("click", async () => {
    go.disabled = true;
    status.textContent = "Transcribing with the base model, then the fine-tuned one…";
    try {
      for (const [who, model] of [["base", `${id}:base`], ["tuned", id]]) {
        const result = await transcribe(model, clip, name);
        document.getElementById(`speech-${who}`).textContent = result.text || "(nothing heard)";
        status.textContent = `${result.duration.toFixed(1)} s of audio, ${result.segments.length} window(s).`;
      }
    } catch (err) { status.textContent = errorText(err); } finally { go.disabled = false; }
  });
  const node = el("section", {class: "chat", id: "speech"}, el("h2", {}, "Transcribe"),
    el("p", {class: "muted small"}, "Record from the microphone or pick a recording (WAV, FLAC, MP3, OGG; 25 MB at most)."),
    el("p", {class: "actions"}, record, " ", stop, " ", pick), player, el("p", {}, go), status, columns);
  return {node, dispose() { recorder?.state === "recording" && recorder.stop(); }};
}
