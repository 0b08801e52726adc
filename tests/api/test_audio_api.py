"""POST /v1/audio/transcriptions through the official openai client: a speech-to-text job's transcripts, equal to
plain transformers' on the same weights; every response format; long audio cut into windows; refusals in
OpenAI's shape."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tunestudio.jobs.manager import JobManager
from tunestudio.jobs.models import Job
from tunestudio.jobs.status import JobStatus
from tunestudio.settings import Settings

from ..helpers.audio import SPEECH, WHISPER, wav_bytes
from ..helpers.chat import ChatHome
from ..helpers.jobs import job_config
from ..helpers.server import running_server
from ..helpers.wait import wait_until

pytestmark = [pytest.mark.timeout(600), pytest.mark.browser]
CLIP = SPEECH / "test" / "test-000.wav"
LIMIT = 200_000  # bytes: this server's max_audio_bytes, so a "too large" recording is small


@pytest.fixture(scope="module")
def served(chat_home: ChatHome) -> Iterator[tuple[str, Job]]:
    settings = Settings(home=chat_home.home, max_audio_bytes=LIMIT)
    with JobManager(settings) as manager:
        job = manager.submit(job_config(WHISPER, chat_home.home / "speech-job", is_dataset_audio=True,
                                        local_datasets=[str(SPEECH)], eval_split="test", eval_steps=20,
                                        eval_generate_rows=4, training_type="full", max_steps=20,
                                        batch_size=16, max_seq_length=32, learning_rate=1e-3))
        job = wait_until(lambda: j if (j := manager.get(job.id)).status.is_terminal else None, 300, "the audio job")
    assert job.status is JobStatus.completed, job.error
    with running_server(settings) as url:
        yield url, job


@pytest.fixture(scope="module")
def client(served: tuple[str, Job]) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{served[0]}/v1", api_key="unused", max_retries=0) as client:
        yield client


def _plain(job: Job, path: Path) -> str:
    """Plain transformers on the job's saved weights and processor: one greedy window."""
    import soundfile
    import torch
    from transformers import AutoModelForSpeechSeq2Seq, AutoProcessor

    processor = AutoProcessor.from_pretrained(job.output_dir)
    model = AutoModelForSpeechSeq2Seq.from_pretrained(job.output_dir).eval()
    samples, rate = soundfile.read(path, dtype="float32")
    with torch.no_grad():
        ids = model.generate(input_features=processor(samples, sampling_rate=rate, return_tensors="pt").input_features,
                             language="en", task="transcribe")
    return processor.batch_decode(ids, skip_special_tokens=True)[0].strip()


def test_a_transcript_in_every_format_as_plain_transformers_reads_it(client: openai.OpenAI,
                                                                     served: tuple[str, Job]) -> None:
    _, job = served
    with CLIP.open("rb") as fh:
        whole = client.audio.transcriptions.create(model=job.id, file=fh)
    assert whole.text == _plain(job, CLIP)
    text: Any = client.audio.transcriptions.create(model=job.id, file=CLIP, response_format="text")
    assert text.strip() == whole.text
    verbose = client.audio.transcriptions.create(model=job.id, file=CLIP, response_format="verbose_json")
    assert verbose.language == "en" and abs(verbose.duration - 0.7) < 0.3
    assert [(s.start, s.text) for s in verbose.segments] == [(0.0, whole.text)]
    srt: Any = client.audio.transcriptions.create(model=job.id, file=CLIP, response_format="srt")
    assert srt.startswith("1\n00:00:00,000 --> 00:00:00,") and whole.text in srt
    vtt: Any = client.audio.transcriptions.create(model=job.id, file=CLIP, response_format="vtt")
    assert vtt.startswith("WEBVTT\n\n00:00:00.000 --> ")
    base = client.audio.transcriptions.create(model=f"{job.id}:base", file=CLIP)
    assert isinstance(base.text, str)  # the random base: whatever it says, through the same path


def test_long_audio_is_cut_into_windows_with_their_times(client: openai.OpenAI, served: tuple[str, Job]) -> None:
    verbose = client.audio.transcriptions.create(model=served[1].id, file=("tone.wav", wav_bytes(5.0)),
                                                 response_format="verbose_json")
    assert [(s.start, s.end) for s in verbose.segments] == [(0.0, 2.0), (2.0, 4.0), (4.0, 5.0)]
    assert abs(verbose.duration - 5.0) < 1e-6


def test_refusals_in_openai_shape(client: openai.OpenAI, served: tuple[str, Job], chat_home: ChatHome) -> None:
    with pytest.raises(openai.BadRequestError, match="is a text model") as text_model:
        client.audio.transcriptions.create(model=chat_home.job.id, file=CLIP)
    assert text_model.value.code == "not_a_speech_model"
    with pytest.raises(openai.BadRequestError, match="not readable audio") as not_audio:
        client.audio.transcriptions.create(model=served[1].id, file=("notes.wav", b"these are my notes" * 10))
    assert not_audio.value.code == "invalid_audio"
    with pytest.raises(openai.APIStatusError, match="over 200,000 bytes, the most a transcription takes") as large:
        client.audio.transcriptions.create(model=served[1].id, file=("long.wav", wav_bytes(10.0)))
    assert large.value.status_code == 413
    with pytest.raises(openai.NotFoundError):
        client.audio.transcriptions.create(model="no-such-job", file=CLIP)
    with pytest.raises(openai.BadRequestError, match=r"language: .*xx"):
        client.audio.transcriptions.create(model=served[1].id, file=CLIP, language="xx")
    # a long prompt keeps its end, within half the decoder's positions: an answer, not a server error
    assert isinstance(client.audio.transcriptions.create(model=served[1].id, file=CLIP, prompt="red " * 400).text,
                      str)


def test_the_page_plays_held_out_clips_and_transcribes_a_file_and_the_microphone(
        served: tuple[str, Job], client: openai.OpenAI) -> None:
    from playwright.sync_api import expect, sync_playwright

    from ..helpers.browser import CHROMIUM, CHROMIUM_ARGS, open_page, screenshot

    url, job = served
    expected = client.audio.transcriptions.create(model=job.id, file=CLIP).text
    # Chromium's fake microphone plays a file: the page records it as WebM/Opus and sends it as WAV
    fake_mic = ["--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
                f"--use-file-for-fake-audio-capture={CLIP}"]
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=[*CHROMIUM_ARGS, *fake_mic])
        with open_page(browser, timeout_ms=60_000) as page:
            page.context.grant_permissions(["microphone"], origin=url)
            page.goto(f"{url}/#/jobs/{job.id}")
            table = page.locator("#evaluation")
            for metric in ("wer", "cer"):
                expect(table.locator(f'tr[data-metric="{metric}"]')).to_have_count(1)
            page.locator("#rows-slot summary").first.click()
            expect(page.locator("#rows-table audio.row-audio")).to_have_count(4)
            assert page.locator("#rows-by").input_value() == "wer"

            page.locator("#speech-file").set_input_files(str(CLIP))
            page.locator("#speech-transcribe").click()
            expect(page.locator("#speech-tuned")).to_have_text(expected or "(nothing heard)")
            expect(page.locator("#speech-base")).not_to_have_text("–")

            page.locator("#speech-record").click()
            expect(page.locator("#speech-status")).to_contain_text("Recording")
            page.wait_for_timeout(1200)  # the fake microphone plays the clip in a loop: record a little of it
            page.locator("#speech-stop").click()
            expect(page.locator("#speech-status")).to_contain_text("Recorded")
            page.locator("#speech-tuned").evaluate("node => { node.textContent = '–'; }")
            page.locator("#speech-transcribe").click()
            expect(page.locator("#speech-status")).to_contain_text("window(s)")
            expect(page.locator("#speech-tuned")).not_to_have_text("–")
            screenshot(page, "audio-job.png")
        browser.close()
