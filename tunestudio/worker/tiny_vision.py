"""The embedded tiny vision-language models, built offline from a family's configuration with its real processor.

Two families, because their image handling differs where the studio's code must not assume one: SmolVLM
(Idefics3's architecture: a SigLIP-shaped tower, pixel shuffle, a fixed number of image tokens an image, images as
`pixel_values` of shape (batch, images, 3, H, W)) and Qwen2-VL (patches flattened to `pixel_values` of shape
(patches, 1176), a per-image `image_grid_thw`, as many image tokens as merged patches, M-RoPE positions).

Each is small (about 1M parameters), deterministic from its seed, and saved with `save_pretrained` (model,
processor, chat template), so the studio loads it through the ordinary `from_pretrained` path as it would a hub
model. Its language half gets the same short pre-training on plain text as the tiny Llama (worker/tiny.py): a
random output layer leaves LoRA nothing to adapt. Then the whole model learns to look (`_pretrain_vision`) at
pictures of other colours and shapes, asked another question: it never sees the demo's colours, shapes or
questions, so the base cannot answer them; naming those is what fine-tuning on the bundled image data teaches
(worker/tiny_images.py).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from tunestudio.worker.tiny_images import COLOURS, SHAPES

FAMILIES = ("smolvlm", "qwen2_vl")
DEFAULT_SEED = 1234
PRETRAIN_STEPS = 150
VISION_STEPS = 1000
IMAGE_SIZE = {"smolvlm": 64, "qwen2_vl": 56}  # pixels a side: 4 image tokens each, a CPU's budget

# Both templates take a message's content as a string or as OpenAI-style parts ({"type": "text"} / {"type":
# "image"}), and wrap the assistant's turn in {% generation %} so TRL's assistant_only_loss can find it.
_CONTENT = (
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}"
    "{% elif part['type'] == 'image' or part['type'] == 'image_url' %}IMAGE{% endif %}{% endfor %}{% endif %}"
)
SMOLVLM_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{{ message['role'] | capitalize }}:"
    "{% if message['role'] == 'assistant' %} {% generation %}" + _CONTENT.replace("IMAGE", "<image>")
    + "<end_of_utterance>{% endgeneration %}\n{% else %} " + _CONTENT.replace("IMAGE", "<image>")
    + "<end_of_utterance>\n{% endif %}{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}"
)
QWEN2_VL_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['role'] == 'assistant' %}{% generation %}"
    + _CONTENT.replace("IMAGE", "<|vision_start|><|image_pad|><|vision_end|>")
    + "<|im_end|>{% endgeneration %}\n{% else %}"
    + _CONTENT.replace("IMAGE", "<|vision_start|><|image_pad|><|vision_end|>")
    + "<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_SPECIAL = {
    "smolvlm": ["<|pad|>", "<|bos|>", "<end_of_utterance>", "<fake_token_around_image>", "<image>", "<global-img>",
                *[f"<row_{r}_col_{c}>" for r in range(1, 5) for c in range(1, 5)]],
    "qwen2_vl": ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                 "<|image_pad|>", "<|video_pad|>"],
}


def _corpus(seed: int, n: int = 2000) -> list[str]:
    """Plain sentences with the demo's words, no image, no chat layout and none of the demo's questions (the
    pre-training's text: the base model knows the words, not how to answer a question about a picture)."""
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        colour, shape = rng.choice(COLOURS), rng.choice(SHAPES)
        lines.append(rng.choice((f"a {colour} {shape}", f"the {shape} is {colour}", f"is it {colour}? {shape}",
                                 f"{colour} and {rng.choice(COLOURS)}", f"what shape? what colour? a {shape}")))
    return lines


def _tokenizer(family: str) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    words = ["User: Assistant: System:", "user assistant system", *_corpus(DEFAULT_SEED, 400)]
    if family == "smolvlm":  # "\n\n" is one token in SmolVLM's vocabulary, and llama.cpp's multimodal tool looks it up
        words.append("\n\n")  # by its text before each Idefics3 image (tools/mtmd/mtmd.cpp): without it, no image
    bpe.train_from_iterator(words, trainers.BpeTrainer(
        vocab_size=512, special_tokens=_SPECIAL[family], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    if family == "smolvlm":
        tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<|bos|>", eos_token="<end_of_utterance>",
                                            pad_token="<|pad|>",
                                            extra_special_tokens={"image_token": "<image>"})
    else:
        tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                            extra_special_tokens={"image_token": "<|image_pad|>",
                                                                  "video_token": "<|video_pad|>"})
    tokenizer.model_max_length = 512
    return tokenizer


def _smolvlm(tokenizer: Any) -> tuple[Any, Any]:
    from transformers import SmolVLMConfig, SmolVLMForConditionalGeneration, SmolVLMImageProcessorPil, SmolVLMProcessor
    from transformers.models.smolvlm.video_processing_smolvlm import SmolVLMVideoProcessor  # needs no torchvision

    side = IMAGE_SIZE["smolvlm"]
    config = SmolVLMConfig(
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"), scale_factor=2,
        vision_config={"hidden_size": 64, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
                       "image_size": side, "patch_size": 16},
        # the architecture the published SmolVLM configs name for their text half (llama.cpp routes on it)
        text_config={"model_type": "llama", "architectures": ["VLlama3ForCausalLM"], "vocab_size": len(tokenizer),
                     "hidden_size": 128,
                     "intermediate_size": 384, "num_hidden_layers": 4, "num_attention_heads": 4,
                     "num_key_value_heads": 2, "max_position_embeddings": 512, "tie_word_embeddings": False,
                     "bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
                     "pad_token_id": tokenizer.pad_token_id},
    )
    # The real SmolVLM splits a large image into tiles of 512 px plus a global view; here images are resized to the
    # tower's side and never split (issue 42: the CPU defaults), so an image is (64/16)^2 / 2^2 = 4 tokens.
    processor = SmolVLMProcessor(
        image_processor=SmolVLMImageProcessorPil(do_image_splitting=False, size={"longest_edge": side},
                                              max_image_size={"longest_edge": side}),
        tokenizer=tokenizer, video_processor=SmolVLMVideoProcessor(), image_seq_len=4,
        chat_template=SMOLVLM_TEMPLATE)
    return SmolVLMForConditionalGeneration(config), processor


def _qwen2_vl(tokenizer: Any) -> tuple[Any, Any]:
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration, Qwen2VLImageProcessorPil, Qwen2VLProcessor

    ids = {name: tokenizer.convert_tokens_to_ids(token) for name, token in (
        ("image_token_id", "<|image_pad|>"), ("video_token_id", "<|video_pad|>"),
        ("vision_start_token_id", "<|vision_start|>"), ("vision_end_token_id", "<|vision_end|>"))}
    config = Qwen2VLConfig(
        **ids,
        # depth 3: llama.cpp's projector converter names the merger's layers by block index and needs 3 or more
        vision_config={"depth": 3, "embed_dim": 64, "hidden_size": 128, "num_heads": 4, "mlp_ratio": 4,
                       "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2},
        text_config={"vocab_size": len(tokenizer), "hidden_size": 128, "intermediate_size": 384,
                     "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
                     "max_position_embeddings": 512, "tie_word_embeddings": False,
                     "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 6, 6]},
                     "bos_token_id": tokenizer.pad_token_id, "eos_token_id": tokenizer.eos_token_id,
                     "pad_token_id": tokenizer.pad_token_id},
    )
    side = IMAGE_SIZE["qwen2_vl"]  # 56 px: a 4x4 grid of 14 px patches, merged 2x2 into 4 image tokens
    processor = Qwen2VLProcessor(
        image_processor=Qwen2VLImageProcessorPil(min_pixels=side * side, max_pixels=side * side, patch_size=14,
                                              merge_size=2, temporal_patch_size=2),
        tokenizer=tokenizer, video_processor=_qwen2_vl_video(), chat_template=QWEN2_VL_TEMPLATE)
    return Qwen2VLForConditionalGeneration(config), processor


def _qwen2_vl_video() -> Any:
    """Qwen2-VL's video processor, or none where torchvision does not load (modalities/vision_compat.py)."""
    from tunestudio.worker.modalities import torchvision_available

    if not torchvision_available():
        return None
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

    return Qwen2VLVideoProcessor()


def _pretrain(model: Any, tokenizer: Any, seed: int, steps: int = PRETRAIN_STEPS, batch_size: int = 32) -> None:
    """The language half's short pre-training on plain text (worker/tiny.py says why), through the whole model."""
    from tunestudio.worker.tiny import pretrain_on

    bos = tokenizer.bos_token or ""
    pretrain_on(model, tokenizer, [bos + text + tokenizer.eos_token for text in _corpus(seed + 1)], seed, steps,
                batch_size)


def _pretrain_vision(model: Any, processor: Any, seed: int, steps: int = VISION_STEPS, batch_size: int = 16) -> None:
    """Teach the model to look: full training on fresh pictures of the pre-training's own colours and shapes,
    asked "What is in the picture?" (answered "a <colour> <shape>"). A random vision tower learns the demo's
    pictures too slowly for a CPU demo (measured: under 80% after 1,500 full fine-tuning steps); a tower that
    has learnt to see other colours and shapes lets LoRA learn the demo's names, which the base never says."""
    import torch
    from trl.trainer.sft_trainer import DataCollatorForVisionLanguageModeling

    from tunestudio.worker.tiny_images import PRETRAIN_COLOURS, PRETRAIN_QUESTION, PRETRAIN_SHAPES, draw

    rng = random.Random(seed + 2)
    collate = DataCollatorForVisionLanguageModeling(processor, max_length=128, assistant_only_loss=True)

    def row() -> dict[str, Any]:
        colour, shape = rng.choice(PRETRAIN_COLOURS), rng.choice(PRETRAIN_SHAPES)
        return {"images": [draw(colour, shape, rng)], "messages": [
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": PRETRAIN_QUESTION}]},
            {"role": "assistant", "content": [{"type": "text", "text": f"a {colour} {shape}"}]}]}

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model.train()
    for _ in range(steps):
        loss = model(**collate([row() for _ in range(batch_size)])).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    model.eval()


def build_tiny_vlm(directory: str | Path, family: str = "smolvlm", seed: int = DEFAULT_SEED) -> Path:
    """Build the family's tiny model and processor from `seed`, pre-train its language half, save both."""
    import torch

    from tunestudio.worker.modalities import allow_missing_video
    from tunestudio.worker.train import configure_threads

    allow_missing_video()
    configure_threads()  # TUNESTUDIO_TORCH_THREADS holds here too: a build beside busy processes spins otherwise
    if family not in FAMILIES:
        raise ValueError(f"family: {family!r} is not one of {', '.join(FAMILIES)}")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = _tokenizer(family)
    tokenizer.chat_template = SMOLVLM_TEMPLATE if family == "smolvlm" else QWEN2_VL_TEMPLATE
    torch.manual_seed(seed)
    model, processor = (_smolvlm if family == "smolvlm" else _qwen2_vl)(tokenizer)
    _pretrain(model, tokenizer, seed)
    _pretrain_vision(model, processor, seed)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.save_pretrained(out)
    processor.save_pretrained(out)
    return out


if __name__ == "__main__":  # python -m tunestudio.worker.tiny_vision DIR [FAMILY]
    import sys

    print(build_tiny_vlm(sys.argv[1], *(sys.argv[2:3] or ["smolvlm"])))
