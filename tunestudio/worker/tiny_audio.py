"""The tiny speech-to-text model (`tunestudio make-tiny-model DIR --audio`): Whisper's architecture
(`WhisperForConditionalGeneration`) with random weights, its real feature extractor and processor, and a tokenizer
built offline that carries Whisper's special tokens in Whisper's order (end of text, start of transcript, the 99
languages, translate, transcribe, start of LM, start of previous, no speech, no timestamps, then the timestamps
0.00 to 30.00), with a `generation_config` (`lang_to_id`, `task_to_id`, `no_timestamps_token_id`, ...), so a job's
language and task work as with real Whisper.

Its window is short: Whisper's encoder takes exactly `max_source_positions x 2` mel frames, 30 s for real Whisper;
here `WINDOW_S` (2 s, 200 frames), which fits the bundled clips (examples/data/speech/, under 1.3 s), so a clip
spends its compute on speech, not padding. The text side is a byte-level BPE learned on the bundled phrases and a
few hundred common English words: any text encodes (byte fallback), the bundled words in one or two tokens.
Deterministic from the seed. Separate from tiny.py: the Makefile rebuilds each model when its own module changes.
"""

from __future__ import annotations

from pathlib import Path

WINDOW_S = 2
MEL_BINS = 80
SAMPLING_RATE = 16_000
WIDTH = 128
LAYERS = 2
HEADS = 4
MAX_TARGET_POSITIONS = 64
DIGITS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
COLOURS = ("red", "green", "blue", "yellow", "black", "white")
COMMON_WORDS = ("the a an and or of to in on at for with is are was be this that it you we they he she not no yes "
          "what which who when where how why hello good morning evening thank please number colour color left "
          "right up down stop go start open close on off call name time day night today tomorrow")


def tokenizer_object():  # type: ignore[no-untyped-def]
    """The `tokenizers` BPE with Whisper's special tokens added after its own tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers.models.whisper.tokenization_whisper import LANGUAGES

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    words = [*DIGITS, *COLOURS, *COMMON_WORDS.split()]
    corpus = [" ".join(words)] * 20 + [f"{d} {c}" for d in DIGITS for c in COLOURS] * 5
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=600, show_progress=False,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    specials = ["<|endoftext|>", "<|startoftranscript|>", *(f"<|{code}|>" for code in LANGUAGES),
                "<|translate|>", "<|transcribe|>", "<|startoflm|>", "<|startofprev|>", "<|nospeech|>",
                "<|notimestamps|>", *(f"<|{i * 0.02:.2f}|>" for i in range(1501))]
    tok.add_special_tokens(specials)
    return tok


def build_tiny_whisper(directory: str | Path, seed: int = 1234, window_s: int = WINDOW_S, width: int = WIDTH,
                       layers: int = LAYERS, heads: int = HEADS, vocab_size: int | None = None,
                       max_target_positions: int = MAX_TARGET_POSITIONS) -> Path:
    """Write the tiny Whisper (model, processor, generation config) to `directory`; the shape's arguments build
    larger ones (bench/audio_train.py: whisper-base's, its vocabulary's size padded with rows no token uses)."""
    import torch
    from transformers import (
        WhisperConfig,
        WhisperFeatureExtractor,
        WhisperForConditionalGeneration,
        WhisperProcessor,
        WhisperTokenizerFast,
    )
    from transformers.models.whisper.tokenization_whisper import LANGUAGES

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    end = "<|endoftext|>"
    tokenizer = WhisperTokenizerFast(tokenizer_object=tokenizer_object(), bos_token=end, eos_token=end,
                                     unk_token=end, pad_token=end)
    features = WhisperFeatureExtractor(feature_size=MEL_BINS, sampling_rate=SAMPLING_RATE, chunk_length=window_s)
    processor = WhisperProcessor(feature_extractor=features, tokenizer=tokenizer)
    ids = tokenizer.convert_tokens_to_ids
    config = WhisperConfig(
        vocab_size=max(vocab_size or 0, len(tokenizer)), num_mel_bins=MEL_BINS, d_model=width,
        encoder_layers=layers, decoder_layers=layers, encoder_attention_heads=heads, decoder_attention_heads=heads,
        encoder_ffn_dim=(4 if width >= 256 else 2) * width, decoder_ffn_dim=(4 if width >= 256 else 2) * width,
        max_source_positions=features.nb_max_frames // 2,
        max_target_positions=max_target_positions, pad_token_id=ids(end), bos_token_id=ids(end),
        eos_token_id=ids(end), decoder_start_token_id=ids("<|startoftranscript|>"),
        begin_suppress_tokens=[ids(end)], suppress_tokens=[])
    torch.manual_seed(seed)
    model = WhisperForConditionalGeneration(config)
    generation = model.generation_config
    generation.decoder_start_token_id = config.decoder_start_token_id
    generation.pad_token_id = generation.eos_token_id = generation.bos_token_id = ids(end)
    generation.no_timestamps_token_id = ids("<|notimestamps|>")
    generation.prev_sot_token_id = ids("<|startofprev|>")
    generation.lang_to_id = {f"<|{code}|>": ids(f"<|{code}|>") for code in LANGUAGES}
    generation.task_to_id = {"transcribe": ids("<|transcribe|>"), "translate": ids("<|translate|>")}
    generation.is_multilingual = True
    generation.max_initial_timestamp_index = 50
    generation.max_length = max_target_positions
    generation.begin_suppress_tokens = [ids(end)]
    generation.suppress_tokens = []
    generation.forced_decoder_ids = None
    generation._from_model_config = False  # else loading rebuilds it from the model's config, without the maps
    model.save_pretrained(out)
    processor.save_pretrained(out)
    return out
