"""A lab run's settings as a TRL script or a verl launch command: the way out of the lab, written from
library_map's blocks. Neither TRL nor verl is imported: the online driver can offer it without the extra.

    export_trl(settings)  -> the text of a runnable TRL 1.16 script (the GRPO family)
    export_verl(settings) -> the verl 0.9 launch command with its Hydra overrides

`settings` is the dict the online driver passes to library_map.library_blocks (its resolved settings
plus max_grad_norm). The TRL script trains a tiny causal LM built from a config, with a character
tokenizer built locally (nothing is downloaded), on the lab's task (the prompt n, the answer n in
binary then EOS) with the lab's verifier as its reward function; a comment says what to change to
scale up. A run on another task (--task countdown) is refused by the TRL export: its script would hold
the wrong dataset and verifier. The verl command names the task's data files. `python bridge.py e2e` runs such a script and recomputes TRL's loss with the lab's atoms.
"""

from __future__ import annotations

import dataclasses
import json

from library_map import library_blocks

# A CPU run of TRL: its defaults are bf16, gradient checkpointing and a learning rate of 1e-6, set for
# pretrained models on GPUs; left so, its log-probs differ from a float32 recompute by about 1e-2.
TRL_CPU = {"use_cpu": True, "bf16": False, "fp16": False, "gradient_checkpointing": False, "report_to": "none"}
# The lab's learning rate moves a table of logits; a freshly built transformer needs a smaller one.
TINY_MODEL_LEARNING_RATE = 3e-3


def _flags(settings):
    """The online_tokens.py options of these settings that differ from the algorithm's defaults, as flags."""
    from online_settings import APPLIES, BY_NAME, resolve  # only the declarations; nothing is trained

    resolved = dataclasses.asdict(resolve({"algorithm": settings["algorithm"]}))
    words = [f"--algorithm {settings['algorithm']}"]
    for key, item in BY_NAME.items():
        if key == "algorithm" or settings["algorithm"] not in APPLIES[key]:
            continue
        if key in settings and settings[key] != resolved.get(key):
            value = settings[key]
            words.append(item.option if isinstance(value, bool) else f"{item.option} {value}")
    return " ".join(words)


def _comment_lines(block):
    lines = []
    for key, reason in block.get("unmatched", {}).items():
        lines.append(f"#   unmatched {key}: {reason}")
    for text in block.get("differences", []):
        lines.append(f"#   differs: {text}")
    return lines or ["#   (nothing: every setting of this run has its option there)"]


REQUIRED = ("algorithm", "task", "prompts", "group_size", "max_new_tokens", "steps", "seed")


def _check_settings(settings):
    """ValueError naming `settings` unless it is the online driver's resolved settings (a dict)."""
    if not isinstance(settings, dict):
        raise ValueError(f"settings: expected the online driver's resolved settings (a dict), got "
                         f"{type(settings).__name__}")
    missing = [key for key in REQUIRED if key not in settings]
    if missing:
        raise ValueError(f"settings: expected the online driver's resolved settings; missing {', '.join(missing)}")


def export_trl(settings):
    """The text of a runnable TRL script for these settings; raises ValueError where TRL has no trainer
    for the algorithm (PPO: none in TRL 1.16), the export does not cover it (DPO) or the task is not the
    binary one (the script holds that task's dataset and verifier), and for settings that are not a
    resolved settings dict."""
    _check_settings(settings)
    if settings["task"] != "binary":
        raise ValueError(f"task: the TRL script holds the binary task's dataset and verifier; --task "
                         f"{settings['task']} is not exported (export a --task binary run, then replace them)")
    block = library_blocks(settings)["trl"]
    if block["options"] is None:
        raise ValueError(f"algorithm: {block['reason']}")
    if block["config"] not in ("GRPOConfig", "RLOOConfig"):
        raise ValueError(f"algorithm: the export covers the GRPO family (GRPOConfig, RLOOConfig); "
                         f"{settings['algorithm']} maps to {block['config']}")
    trainer = block["config"].replace("Config", "Trainer")
    options = json.dumps(block["options"], indent=4, sort_keys=False).replace("true", "True").replace(
        "false", "False").replace("null", "None")
    batch = settings["prompts"] * settings["group_size"]
    return TRL_SCRIPT.format(
        flags=_flags(settings), comments="\n".join(_comment_lines(block)), config=block["config"],
        trainer=trainer, options=options, cpu=json.dumps(TRL_CPU).replace("true", "True").replace("false", "False"),
        learning_rate=TINY_MODEL_LEARNING_RATE, batch=batch, max_new_tokens=settings["max_new_tokens"],
        steps=settings["steps"], seed=settings["seed"], beta=block["options"].get("beta", 0.0),
    )


TRL_SCRIPT = '''"""TRL 1.16 run of the lab's `python online_tokens.py {flags}`.

The lab's task (the prompt is a number n in 0..5; the answer is n in binary, then EOS) with the lab's
verifier as the reward function, on a tiny causal LM built from a config and a character tokenizer
built here: nothing is downloaded, and a few steps run on a CPU in well under a minute.

    python this_file.py --steps 3 --output run-folder

What the lab's settings become in TRL ({config}), and what TRL cannot do of them:
{comments}

To scale up: load a pretrained model and its tokenizer (AutoModelForCausalLM / AutoTokenizer
.from_pretrained) instead of build_model() and build_tokenizer(), drop warm_start(), write the prompts
as your task's text, set bf16=True and the learning rate of your model (TRL's default is 1e-6),
use_vllm=True for generation on GPUs, and raise max_completion_length.
"""

import argparse
import os

import torch
from datasets import Dataset
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from trl import {config}, {trainer}

# the options library_map gives for the lab's settings
OPTIONS = {options}
# a CPU run: TRL's defaults (bf16, gradient checkpointing) are for GPUs
CPU = {cpu}
# the lab's learning rate moves a table of logits; this freshly built transformer needs a smaller one
LEARNING_RATE = {learning_rate}
BATCH = {batch}  # prompts x group_size completions per optimizer step, as the lab's B*G
MAX_NEW_TOKENS = {max_new_tokens}
STEPS = {steps}
SEED = {seed}
NUMBERS = tuple(range(6))
ANSWERS = {{str(n): format(n, "b") for n in NUMBERS}}
REWARD_CORRECT, REWARD_PARTIAL = 1.0, 0.25
VOCABULARY = ["<pad>", "<bos>", "<eos>"] + [str(digit) for digit in range(10)]


def build_tokenizer():
    """One token per character; every text starts with <bos>; decoding joins the characters again."""
    tokenizer = Tokenizer(models.WordLevel({{token: i for i, token in enumerate(VOCABULARY)}}, unk_token="<pad>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    tokenizer.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<bos>", eos_token="<eos>",
                                   pad_token="<pad>")


def build_model(tokenizer):
    config = LlamaConfig(vocab_size=len(VOCABULARY), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=32,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True)
    torch.manual_seed(SEED)
    return LlamaForCausalLM(config)


def warm_start(model, tokenizer, steps=30):
    """A few supervised steps on the answers: a random model scores 0 on every sample, so every
    advantage would be 0 and RL would have nothing to learn from."""
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    texts = [prompt + ANSWERS[prompt] for prompt in ANSWERS]
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    ids = torch.cat([batch["input_ids"], torch.full((len(texts), 1), tokenizer.pad_token_id)], dim=1)
    lengths = batch["attention_mask"].sum(dim=1)
    ids[torch.arange(len(texts)), lengths] = tokenizer.eos_token_id  # the answer ends with EOS
    labels = torch.full_like(ids, -100)
    for row, length in enumerate(lengths.tolist()):
        labels[row, 2:length + 1] = ids[row, 2:length + 1]  # the answer and EOS, not <bos> n
    for _ in range(steps):
        loss = model(input_ids=ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def make_verifier(tokenizer):
    eos = tokenizer.eos_token_id

    def verifier(prompts, completions, completion_ids, **kwargs):
        """The lab's rule-based reward: 1 for the exact answer then EOS, 0.25 for a response cut at the
        length limit that starts with the answer, else 0. The completion text carries no EOS; the ids do."""
        rewards = []
        for prompt, ids in zip(prompts, completion_ids):
            answer = tokenizer.convert_tokens_to_ids(list(ANSWERS[prompt]))
            ids = list(ids)
            if eos in ids:
                rewards.append(REWARD_CORRECT if ids[: ids.index(eos) + 1] == answer + [eos] else 0.0)
            elif len(ids) >= MAX_NEW_TOKENS and ids[: len(answer)] == answer:
                rewards.append(REWARD_PARTIAL)
            else:
                rewards.append(0.0)
        return rewards

    return verifier


def make_trainer(output, steps=STEPS, trainer_class={trainer}):
    """The trainer of this run, its model saved first in `output`/model (with beta > 0, TRL loads the
    reference model from the model's path)."""
    tokenizer = build_tokenizer()
    model = build_model(tokenizer)
    warm_start(model, tokenizer)
    model_path = os.path.join(output, "model")
    model.save_pretrained(model_path)
    tokenizer.save_pretrained(model_path)
    dataset = Dataset.from_dict({{"prompt": [str(n) for n in NUMBERS] * 64}})
    args = {config}(output_dir=output, **CPU, **{{**OPTIONS, "learning_rate": LEARNING_RATE}},
                    per_device_train_batch_size=BATCH, max_steps=steps, logging_steps=1, save_strategy="no",
                    seed=SEED)
    return trainer_class(model=model_path if {beta} > 0 else model, reward_funcs=make_verifier(tokenizer),
                         args=args, train_dataset=dataset, processing_class=tokenizer)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--output", default="trl-run")
    args = parser.parse_args()
    make_trainer(args.output, args.steps).train()


if __name__ == "__main__":
    main()
'''


VERL_LAUNCH = {
    "data.train_files": "$HOME/data/binary/train.parquet",
    "data.val_files": "$HOME/data/binary/test.parquet",
    "actor_rollout_ref.model.path": "Qwen/Qwen2.5-0.5B-Instruct",
}


def export_verl(settings):
    """The verl 0.9 launch command (python3 -m verl.trainer.main_ppo with Hydra overrides) for these
    settings, with comments for what verl cannot do of them; for DPO, a comment saying why there is none.
    Raises ValueError for settings that are not a resolved settings dict."""
    _check_settings(settings)
    block = library_blocks(settings)["verl"]
    header = [f"# verl 0.9.1 launch of the lab's `python online_tokens.py {_flags(settings)}`"]
    if block["options"] is None:
        return "\n".join(header + [f"# none: {block['reason']}"]) + "\n"
    header += _comment_lines(block)
    header += ["# the data files hold the task's prompts (verl's parquet format) and the model path is yours:",
               "# the lab's tiny policy has no verl equivalent; the batch sizes are the lab's B prompts, and",
               "# its learning rate moves a table of logits: set your model's (actor_rollout_ref.actor.optim.lr)."]
    batch = settings["prompts"]
    data = {"data.train_files": f"$HOME/data/{settings['task']}/train.parquet",
            "data.val_files": f"$HOME/data/{settings['task']}/test.parquet"}
    overrides = {**VERL_LAUNCH, **data, "data.train_batch_size": batch, "actor_rollout_ref.actor.ppo_mini_batch_size": batch,
                 "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": batch * settings["group_size"],
                 **block["options"]}
    lines = ["python3 -m verl.trainer.main_ppo \\"]
    items = list(overrides.items())
    for index, (key, value) in enumerate(items):
        shown = "null" if value is None else str(value).lower() if isinstance(value, bool) else repr(value) \
            if isinstance(value, float) else str(value)
        lines.append(f"    {key}={shown}" + (" \\" if index < len(items) - 1 else ""))
    return "\n".join(header + lines) + "\n"
