"""A lab run's settings as a TRL script or a verl launch command: the way out of the lab, written from
library_map's blocks. Neither TRL nor verl is imported: the online driver can offer it without the extra.

    export_trl(settings)                             -> the text of a runnable TRL 1.16 script: the GRPO family
                                                        (GRPOTrainer, RLOOTrainer), offline DPO (DPOTrainer) and
                                                        online DPO (OnlineDPOTrainer)
    export_verl(settings, model=None, data_dir=None) -> a shell script: verl 0.9.1's main_ppo and its overrides

`settings` is the dict the online driver passes to library_map.library_blocks (its resolved settings
plus max_grad_norm). The TRL script reads the task's prompts and its text verifier from the folder that
`online_tokens.py --task T --export-data DIR` writes (task_data.py), on either task. By default it trains a
tiny causal LM built from a config with the lab's own vocabulary as a character tokenizer (nothing is
downloaded, a few steps run on a CPU); `--model NAME_OR_PATH` takes a pretrained model instead, with the
learning rate, batch layout, lengths and precision of one. Its header names every setting TRL cannot
carry. `python bridge.py e2e` runs such a script and recomputes TRL's loss with the lab's atoms.

The verl command trains a pretrained model (--model; default VERL_MODEL) on one node, on the parquet
files and the text verifier that `online_tokens.py --export-data DIR` writes (--export-data-dir). It
passes verl's own start-up checks as written: the micro-batch sizes, rollout.name, PPO's critic model
(test_bridge.VerlLaunch runs main_ppo up to ray.init on a set of exports, VERL_EXPORTS). Its header says what verl does
differently (library_map's block), each value set for a real model with its reason (learning rate,
batch, lengths), what stays the lab's (steps, seeds, a constant learning rate, weight decay 0) and
every setting of the lab's own policy that does not carry. DPO (verl has no DPO trainer) and a loss or
an advantage verl lacks are refused: the command would train another algorithm.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import textwrap

from library_map import library_blocks

# The exported script's rate for its freshly built tiny model (the lab's own rate is for its own models): with
# 3e-3 the default binary run's batch reward swings between 0.2 and 0.9 late in the run, with 1e-3 it rises to 0.97
TINY_MODEL_LEARNING_RATE = 1e-3
# the tiny model's SFT steps per task: the binary task's six answers are learnt in a few dozen steps
WARM_START_STEPS = {"binary": 30, "countdown": 100}
TRL_TRAINERS = {  # the map's config name -> (the import line, the trainer class, the script's body)
    "GRPOConfig": ("from trl import GRPOConfig, GRPOTrainer", "GRPOTrainer", "group"),
    "RLOOConfig": ("from trl import RLOOConfig, RLOOTrainer", "RLOOTrainer", "group"),
    "DPOConfig": ("from trl import DPOConfig, DPOTrainer", "DPOTrainer", "offline_dpo"),
    "OnlineDPOConfig (trl.experimental.online_dpo)": (
        "from trl.experimental.online_dpo import OnlineDPOConfig, OnlineDPOTrainer", "OnlineDPOTrainer", "online_dpo"),
}
# the options the script sets itself (scaled with the model), not from the map's block
SCRIPT_OPTIONS = ("learning_rate", "max_completion_length", "max_new_tokens")
# the characters of each task's prompts and responses (BOS and EOS are the tokenizer's own tokens)
TASK_CHARACTERS = {"binary": "0123456789", "countdown": "0123456789+-*:="}


def _flags(settings):
    """The online_tokens.py options of these settings that differ from the algorithm's defaults, as flags."""
    from online_settings import APPLIES, BY_NAME, resolve  # only the declarations; nothing is trained

    resolved = dataclasses.asdict(resolve({"algorithm": settings["algorithm"], "task": settings["task"],
                                           "policy": settings.get("policy", "table")}))
    words = [f"--algorithm {settings['algorithm']}"]
    for key, item in BY_NAME.items():
        if key == "algorithm" or settings["algorithm"] not in APPLIES[key]:
            continue
        if key in settings and settings[key] != resolved.get(key) or key in ("task", "policy") and \
                settings.get(key) != BY_NAME[key].default:
            value = settings[key]
            words.append(item.option if isinstance(value, bool) else f"{item.option} {value}")
    return " ".join(words)


def _comment_lines(block, prefix="#   "):
    lines = []
    for key, reason in block.get("unmatched", {}).items():
        lines.append(f"{prefix}unmatched {key}: {reason}")
    for text in block.get("differences", []):
        lines.append(f"{prefix}differs: {text}")
    return lines or [f"{prefix}(nothing: every setting of this run has its option there)"]


REQUIRED = ("algorithm", "task", "prompts", "group_size", "max_new_tokens", "steps", "seed")


def _check_settings(settings):
    """ValueError naming `settings` unless it is the online driver's resolved settings (a dict)."""
    if not isinstance(settings, dict):
        raise ValueError(f"settings: expected the online driver's resolved settings (a dict), got "
                         f"{type(settings).__name__}")
    missing = [key for key in REQUIRED if key not in settings]
    if missing:
        raise ValueError(f"settings: expected the online driver's resolved settings; missing {', '.join(missing)}")


def _python(value):
    """A JSON-able value as Python source."""
    return json.dumps(value, indent=4).replace("true", "True").replace("false", "False").replace("null", "None")


def _wrap(line, width=112):
    """A header line as lines of at most `width` characters; a bullet's continuation indented under it."""
    if len(line) <= width:
        return [line]
    indent = "    " if line.startswith("  - ") else ""
    return textwrap.wrap(line, width=width, subsequent_indent=indent, break_on_hyphens=False)


def _not_carried(settings, block, body):
    """The settings of the lab's run that the TRL script cannot carry, each with its reason."""
    lines = [
        "the lab's evaluation: it scores the table policy exactly on every prompt after each update (the "
        "transformer on fixed draws of prompts); TRL logs the sampled batch's reward (reward, "
        "rewards/<function>/mean): evaluate on data/test.jsonl yourself",
        "the policy: the lab's (a logit table or tiny_lm.py's transformer) is no Hugging Face model; the tiny "
        "Llama here has the lab's vocabulary and a short SFT warm start on the train solutions",
        "the prompt draws: the lab draws B prompts with replacement each iteration; TRL shuffles the dataset "
        "and goes through it without replacement",
    ]
    if settings["tis_cap"] is not None or settings.get("rollout_correction") is not None:
        lines.append("TIS / rollout correction: TRL corrects only vLLM's sampler against the trainer, with "
                     "use_vllm=True; a CPU has no vLLM, so this script runs without the correction unless it is "
                     "given --vllm (a GPU with vLLM installed)")
    if body == "online_dpo" and settings["updates_per_batch"] > 1:
        lines.append(f"--updates-per-batch {settings['updates_per_batch']}: OnlineDPOTrainer takes one optimizer "
                     "step per sampled batch")
    if body == "online_dpo" and settings["temperature"] != 1.0:
        lines.append("--temperature: OnlineDPOTrainer samples at its temperature but scores at 1")
    if body == "offline_dpo":
        lines.append("the rejected response's end: DPOTrainer appends EOS to every response, so a rejected "
                     "response that the lab counts as truncated (no EOS) is trained with one")
        lines.append("the batch: the lab's iteration holds one pair per prompt whose rewards vary (fewer than B "
                     f"when some tie); here every optimizer step holds B = {settings['prompts']} pairs")
    return lines


def export_trl(settings):
    """The text of a runnable TRL script for these settings (either task); raises ValueError where TRL has
    no trainer for the algorithm (PPO: none in TRL 1.16), the export does not cover its config (SimPO's
    CPOConfig) or a setting cannot be carried faithfully, and for settings that are not a resolved dict."""
    _check_settings(settings)
    block = library_blocks(settings)["trl"]
    if block["options"] is None:
        raise ValueError(f"algorithm: {block['reason']}")
    if block["config"] not in TRL_TRAINERS:
        raise ValueError(f"algorithm: the export covers {', '.join(TRL_TRAINERS)}; {settings['algorithm']} "
                         f"with these settings maps to {block['config']}")
    import_line, trainer, body = TRL_TRAINERS[block["config"]]
    config = block["config"].split()[0]
    options = {key: value for key, value in block["options"].items() if key not in SCRIPT_OPTIONS}
    options.pop("use_vllm", None)  # the script's --vllm: a CPU has no vLLM
    vllm = {key: options.pop(key) for key in list(options) if key.startswith("vllm_")}
    unmatched = dict(block["unmatched"])
    carried = []
    overlong = settings.get("overlong_penalty")
    if overlong is not None and body == "group":
        unmatched.pop("overlong_penalty", None)
        carried.append(f"--overlong-penalty {overlong}: trl.rewards.get_soft_overlong_punishment"
                       f"({settings['max_new_tokens']}, {overlong}) in reward_funcs, added to the verifier's reward")
    updates = settings["updates_per_batch"]
    steps_line = {
        "group": (f"the lab's --steps {settings['steps']} iterations (each samples B x G = {settings['prompts']} x "
                  f"{settings['group_size']} responses, then takes --updates-per-batch {updates} Adam steps on them) "
                  f"are TRL's max_steps = steps x {updates} optimizer steps (num_iterations={updates}), one "
                  f"generation of B x G completions per {updates} of them."),
        "offline_dpo": (f"the lab's --steps {settings['steps']} iterations each sample B x G = {settings['prompts']} x "
                        f"{settings['group_size']} responses from the frozen initial policy and pair the best with "
                        f"the worst of each group: make_pairs() samples the same from the initial model, and "
                        f"DPOTrainer goes over the pairs num_train_epochs = {updates} times (--updates-per-batch)."),
        "online_dpo": (f"the lab's --steps {settings['steps']} iterations are TRL's max_steps, one optimizer step "
                       f"per sampled batch of B = {settings['prompts']} prompts x 2 completions."),
    }[body]
    header = [
        f'"""TRL 1.16 run of the lab\'s `python online_tokens.py {_flags(settings)}`.',
        "",
        f"    python online_tokens.py --task {settings['task']} --export-data data   # the prompts and the verifier",
        "    python this_file.py --data data --steps 2 --output run                # a tiny model: a CPU, no download",
        "    python this_file.py --data data --model NAME_OR_PATH --output run     # your model, on a GPU",
        "",
        f"{trainer} on the prompts of data/train.jsonl, scored by data/rl_lab_verifier.py (the lab's verifier on",
        "decoded text). The default model is a tiny Llama built here from a config, with the lab's vocabulary as a",
        "character tokenizer; --model takes a pretrained causal LM and its tokenizer instead (Hugging Face",
        "name or folder), prompts it with the task in words (the `instruction` column, chat format) and",
        "scales the learning rate, batch layout, lengths and precision (see scaled()).",
        "",
        "Run length: " + steps_line,
        f"Seed {settings['seed']}; the learning rate is constant as the lab's (lr_scheduler_type=\"constant\"; TRL's",
        "default decays it linearly) and weight decay is 0 (TRL's AdamW with weight_decay=0 is the lab's Adam).",
        "",
        f"What the lab's settings become in TRL ({config}), and what TRL cannot do of them:",
        *_comment_lines({"unmatched": unmatched, "differences": block["differences"]}, prefix="  - "),
        *(["Carried by a reward function:", *[f"  - {line}" for line in carried]] if carried else []),
        "Not carried to TRL:",
        *[f"  - {line}" for line in _not_carried(settings, block, body)],
        '"""',
    ]
    header = [wrapped for line in header for wrapped in _wrap(line)]
    constants = {
        "TASK": settings["task"], "CHARACTERS": TASK_CHARACTERS[settings["task"]],
        "ITERATIONS": settings["steps"], "UPDATES_PER_BATCH": updates, "SEED": settings["seed"],
        "PROMPTS": settings["prompts"], "GROUP_SIZE": settings["group_size"],
        "MAX_NEW_TOKENS": settings["max_new_tokens"], "TEMPERATURE": settings["temperature"],
        "OVERLONG_CACHE": overlong if body == "group" else None,
    }
    lines = [f"{name} = {value!r}" for name, value in constants.items()]
    text = (TRL_COMMON.replace("@IMPORT@", import_line)
            .replace("@DATASETS@", ", ".join(DATASETS_IMPORTS[body]))
            .replace("@TRANSFORMERS@", ", ".join(TRANSFORMERS_IMPORTS[body]))
            .replace("@OVERLONG@", "from trl.rewards import get_soft_overlong_punishment\n"
                     if constants["OVERLONG_CACHE"] is not None else "")
            .replace("@CONSTANTS@", "\n".join(lines)).replace("@OPTIONS@", _python(options))
            .replace("@VLLM@", _python(vllm)).replace("@TINY_LR@", repr(TINY_MODEL_LEARNING_RATE))
            .replace("@WARM_START_STEPS@", str(WARM_START_STEPS[settings["task"]])))
    body_text = TRL_BODIES[body].replace("@CONFIG@", config).replace("@TRAINER@", trainer)
    return "\n".join(header) + "\n" + text + body_text + TRL_MAIN


TRL_COMMON = '''
import argparse
import importlib.util
import os
import sys

import torch
from datasets import @DATASETS@
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import @TRANSFORMERS@
@IMPORT@
@OVERLONG@
# the lab's run
@CONSTANTS@
# the options library_map gives for the lab's settings (the learning rate and lengths are set in scaled())
OPTIONS = @OPTIONS@
# TRL's correction of vLLM's sampler against the trainer: it exists only with vLLM (--vllm, a GPU)
VLLM = @VLLM@
# the tiny model's SFT warm start: a random model scores 0, so every advantage would be 0; enough Adam steps
# (on every train prompt) to get some groups right and some wrong
WARM_START_STEPS = @WARM_START_STEPS@


def scaled(model_name):
    """The settings that depend on the model: the tiny one built here, or a pretrained one (--model)."""
    if model_name is None:
        return {
            # a rate for this freshly built tiny model (not the lab's own, which the header gives): at 3e-3 the
            # binary run's reward swings late in the run, at 1e-3 it rises steadily
            "learning_rate": @TINY_LR@,
            # one micro-batch holds the lab's whole batch (B x G completions, or B pairs)
            "per_device_train_batch_size": PROMPTS * GROUP_SIZE,
            "gradient_accumulation_steps": 1,
            # the lab's cap: the character tokenizer writes one lab token per token
            "max_completion_length": MAX_NEW_TOKENS,
            # a CPU run in float32: TRL's defaults (bf16, activation checkpointing) are for GPUs, and bf16
            # log-probs differ from a float32 recompute by about 1e-2
            "use_cpu": True, "bf16": False, "activation_checkpointing": False,
        }
    return {
        # TRL's default for pretrained models: the lab's rates (0.2 for its table, 3e-4 for its transformer) and
        # this script's tiny-model rate would wreck one in a few steps
        "learning_rate": 1e-6,
        # one group per micro-batch fits a GPU's memory; B micro-batches accumulate to the lab's B x G per step
        "per_device_train_batch_size": GROUP_SIZE,
        "gradient_accumulation_steps": PROMPTS,
        # a BPE tokenizer and a chat model write the answer in words and spaces: room to finish, while the
        # verifier still scores only the exact answer
        "max_completion_length": 256,
        # bf16 on a GPU that has it (a CPU or an older GPU trains in float32); activation checkpointing trades
        # compute for memory
        "use_cpu": not torch.cuda.is_available(),
        "bf16": torch.cuda.is_available() and torch.cuda.is_bf16_supported(),
        "activation_checkpointing": True,
    }


def load_verifier(data):
    """The text verifier that --export-data wrote beside the prompts (standard library only)."""
    spec = importlib.util.spec_from_file_location("rl_lab_verifier", os.path.join(data, "rl_lab_verifier.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_prompts(data, model_name, split="train"):
    """The task's prompts: the lab's compact text for the tiny model (its tokens, one character each), the
    task in words as a chat message for a pretrained model; the answer columns stay for the verifier."""
    dataset = load_dataset("json", data_files={split: os.path.join(data, f"{split}.jsonl")})[split]
    column = {"countdown": "numbers", "binary": "number"}[TASK]  # an answer column only this task's prompts have
    if column not in dataset.column_names:  # another task's prompts would train without a word
        sys.exit(f"--data: {data} holds another task's prompts, not {TASK}'s (no '{column}' column); write them "
                 f"with: python online_tokens.py --task {TASK} --export-data {data}")
    if model_name is not None:
        dataset = dataset.map(lambda row: {"prompt": [{"role": "user", "content": row["instruction"]}]})
    return dataset


def build_tokenizer():
    """One token per character of the lab's vocabulary; every text starts with <bos>; PAD shares EOS's id
    (as in the lab: the attention mask, not the id, marks padding)."""
    vocabulary = ["<bos>", "<eos>"] + list(CHARACTERS)
    tokenizer = Tokenizer(models.WordLevel({token: i for i, token in enumerate(vocabulary)}, unk_token="<eos>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    tokenizer.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 0)])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<bos>", eos_token="<eos>",
                                   pad_token="<eos>", padding_side="left")


def build_model(tokenizer):
    """A 2-layer Llama of about 30k parameters over the lab's vocabulary."""
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True)
    torch.manual_seed(SEED)
    return LlamaForCausalLM(config)


def warm_start(model, tokenizer, dataset):
    """A short SFT on one correct response of every train prompt, then EOS (the answer and EOS are trained,
    not the prompt)."""
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    prompts = [tokenizer(prompt)["input_ids"] for prompt in dataset["prompt"]]
    answers = [tokenizer(solution, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
               for solution in dataset["solution"]]
    width = max(len(prompt) + len(answer) for prompt, answer in zip(prompts, answers))
    ids = torch.full((len(prompts), width), tokenizer.pad_token_id)
    labels = torch.full_like(ids, -100)
    mask = torch.zeros_like(ids)
    for row, (prompt, answer) in enumerate(zip(prompts, answers)):  # right-padded: positions start at 0
        ids[row, :len(prompt) + len(answer)] = torch.tensor(prompt + answer)
        labels[row, len(prompt):len(prompt) + len(answer)] = torch.tensor(answer)
        mask[row, :len(prompt) + len(answer)] = 1
    for _ in range(WARM_START_STEPS):
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def initial_model(output, model_name, dataset):
    """(the path of the model to train, its tokenizer): a pretrained model as given, or the tiny one built,
    warmed up and saved in `output`/model (TRL loads the reference model from that path)."""
    if model_name is not None:
        return model_name, AutoTokenizer.from_pretrained(model_name)
    tokenizer = build_tokenizer()
    model = build_model(tokenizer)
    warm_start(model, tokenizer, dataset)
    path = os.path.join(output, "model")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path, tokenizer


def common_args(model_name):
    """The Trainer's arguments every run shares: the model's scale, the lab's seed, a constant learning
    rate and no weight decay (the lab's Adam), and the options a GPU run adds with --vllm."""
    return {**scaled(model_name), "seed": SEED, "lr_scheduler_type": "constant", "weight_decay": 0.0,
            "logging_steps": 1, "save_strategy": "no", "report_to": "none"}
'''

REWARDS = '''

def make_reward(verifier, tokenizer):
    """TRL's reward function: the verifier on the decoded completions, told which were cut at the length
    limit (their ids end without EOS, TRL's own test of truncation)."""
    stops = {tokenizer.eos_token_id, tokenizer.pad_token_id}

    def rl_lab_reward(completions, completion_ids, **columns):
        truncated = [not ids or ids[-1] not in stops for ids in completion_ids]
        return verifier.reward_func(completions, truncated=truncated, **columns)

    return rl_lab_reward


def reward_funcs(verifier, tokenizer, model_name):
    """The verifier and, for an overlong penalty, TRL's soft overlong punishment: TRL adds their rewards."""
    functions = [make_reward(verifier, tokenizer)]
    if OVERLONG_CACHE is not None:
        cap = scaled(model_name)["max_completion_length"]
        # the penalty's ramp keeps its share of the cap when a pretrained model gets a longer one
        functions.append(get_soft_overlong_punishment(cap, max(1, round(OVERLONG_CACHE * cap / MAX_NEW_TOKENS))))
    return functions
'''
REPEATED = '''

def repeated(dataset, steps):
    """The dataset repeated to hold the prompts of `steps` iterations: the lab draws B prompts with
    replacement, so B may exceed the task's prompts (the binary task has six)."""
    copies = max(1, -(-PROMPTS * steps // len(dataset)))  # ceil(B * steps / P)
    return concatenate_datasets([dataset] * copies)
'''
# what each script imports from datasets and transformers (offline DPO samples its pairs itself)
DATASETS_IMPORTS = {"group": ("concatenate_datasets", "load_dataset"),
                    "online_dpo": ("concatenate_datasets", "load_dataset"), "offline_dpo": ("Dataset", "load_dataset")}
TRANSFORMERS = ("AutoTokenizer", "LlamaConfig", "LlamaForCausalLM", "PreTrainedTokenizerFast")
TRANSFORMERS_IMPORTS = {"group": TRANSFORMERS, "online_dpo": TRANSFORMERS,
                        "offline_dpo": ("AutoModelForCausalLM",) + TRANSFORMERS}
TRL_BODIES = {
    "group": REWARDS + REPEATED + '''

def make_trainer(output, steps=ITERATIONS, trainer_class=@TRAINER@, data="data", model_name=None, vllm=False):
    """The trainer of `steps` lab iterations (steps x UPDATES_PER_BATCH optimizer steps)."""
    dataset = repeated(load_prompts(data, model_name), steps)
    model_path, tokenizer = initial_model(output, model_name, load_prompts(data, None))
    args = common_args(model_name)
    config = @CONFIG@(output_dir=output, **{**OPTIONS, **(VLLM if vllm else {})}, **args,
                      max_steps=steps * UPDATES_PER_BATCH, use_vllm=vllm)
    return trainer_class(model=model_path, reward_funcs=reward_funcs(load_verifier(data), tokenizer, model_name),
                         args=config, train_dataset=dataset, processing_class=tokenizer)
''',
    "offline_dpo": '''

def make_pairs(model_path, tokenizer, dataset, verifier, iterations, model_name):
    """The lab's offline pairs: each iteration draws PROMPTS prompts (with replacement), samples GROUP_SIZE
    responses to each from the frozen initial model, and pairs the highest reward (chosen) with the lowest
    (rejected), the first in sampling order among equals; a prompt whose rewards all tie gives no pair."""
    if model_name is None:
        model = LlamaForCausalLM.from_pretrained(model_path)
    else:
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype="auto", device_map="auto")
    generator = torch.Generator().manual_seed(SEED)
    length = scaled(model_name)["max_completion_length"]
    pairs = {"prompt": [], "chosen": [], "rejected": []}
    for _ in range(iterations):
        for index in torch.randint(0, len(dataset), (PROMPTS,), generator=generator).tolist():
            row = dataset[index]
            prompt = row["prompt"]
            text = prompt if model_name is None else tokenizer.apply_chat_template(
                prompt, add_generation_prompt=True, tokenize=False)
            inputs = tokenizer(text, return_tensors="pt", add_special_tokens=model_name is None).to(model.device)
            torch.manual_seed(int(torch.randint(0, 2**31 - 1, (), generator=generator)))
            with torch.no_grad():
                output = model.generate(**inputs, do_sample=True, temperature=TEMPERATURE, top_k=0, top_p=1.0,
                                        max_new_tokens=length, num_return_sequences=GROUP_SIZE,
                                        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
            completions, truncated = [], []
            for ids in output[:, inputs["input_ids"].shape[1]:].tolist():
                stop = ids.index(tokenizer.eos_token_id) if tokenizer.eos_token_id in ids else len(ids)
                completions.append(tokenizer.decode(ids[:stop], skip_special_tokens=True))
                truncated.append(stop == len(ids))
            columns = {key: [value] * GROUP_SIZE for key, value in row.items() if key != "prompt"}
            rewards = verifier.reward_func(completions, truncated=truncated, **columns)
            best, worst = rewards.index(max(rewards)), rewards.index(min(rewards))
            if rewards[best] == rewards[worst]:  # a tie teaches no preference
                continue
            pairs["prompt"].append(prompt)
            if model_name is None:
                pairs["chosen"].append(completions[best])
                pairs["rejected"].append(completions[worst])
            else:
                pairs["chosen"].append([{"role": "assistant", "content": completions[best]}])
                pairs["rejected"].append([{"role": "assistant", "content": completions[worst]}])
    if not pairs["prompt"]:
        raise ValueError(f"no preference pair in {iterations} iterations: every group's rewards tie")
    return Dataset.from_dict(pairs)


def make_trainer(output, steps=ITERATIONS, trainer_class=@TRAINER@, data="data", model_name=None, vllm=False):
    """The trainer on the pairs of `steps` lab iterations, each seen UPDATES_PER_BATCH times."""
    model_path, tokenizer = initial_model(output, model_name, load_prompts(data, None))
    pairs = make_pairs(model_path, tokenizer, load_prompts(data, model_name), load_verifier(data), steps, model_name)
    args = common_args(model_name)
    args.pop("max_completion_length")  # the pairs are texts: DPOTrainer's max_length bounds them
    args["per_device_train_batch_size"] //= GROUP_SIZE  # B pairs per optimizer step, as the lab's B prompts
    config = @CONFIG@(output_dir=output, **OPTIONS, **args, num_train_epochs=UPDATES_PER_BATCH)
    return trainer_class(model=model_path, args=config, train_dataset=pairs, processing_class=tokenizer)
''',
    "online_dpo": REWARDS + REPEATED + '''

def make_trainer(output, steps=ITERATIONS, trainer_class=@TRAINER@, data="data", model_name=None, vllm=False):
    """The trainer of `steps` lab iterations, one optimizer step each on B prompts x 2 completions."""
    dataset = repeated(load_prompts(data, model_name), steps)
    model_path, tokenizer = initial_model(output, model_name, load_prompts(data, None))
    args = common_args(model_name)
    length = args.pop("max_completion_length")
    args["per_device_train_batch_size"] //= GROUP_SIZE  # B prompts per step; TRL samples 2 completions each
    config = @CONFIG@(output_dir=output, **OPTIONS, **args, max_new_tokens=length, max_steps=steps,
                      use_vllm=vllm)
    return trainer_class(model=model_path, reward_funcs=reward_funcs(load_verifier(data), tokenizer, model_name),
                         args=config, train_dataset=dataset, processing_class=tokenizer)
''',
}

TRL_MAIN = '''

class Parser(argparse.ArgumentParser):
    """A bad flag is one line naming it on stderr and exit status 2, before anything is read or written."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())}\\n")


def steps_count(text):
    """--steps: an integer >= 1."""
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return int(text)


def main(argv=None):
    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="data", help="the folder of online_tokens.py --export-data (default: data)")
    parser.add_argument("--model", default=None, help="a pretrained causal LM (Hugging Face name or folder); "
                                                      "default: the tiny model built here")
    parser.add_argument("--steps", type=steps_count, default=ITERATIONS,
                        help=f"the lab's iterations, an integer >= 1 (default {ITERATIONS})")
    parser.add_argument("--output", default="trl-run", help="the output folder (default: trl-run)")
    parser.add_argument("--vllm", action="store_true",
                        help="generate with vLLM (a GPU); TRL's correction of its sampler is set as the lab's run "
                             "had it (VLLM above: on with --tis-cap, off otherwise)")
    args = parser.parse_args(argv)
    missing = [name for name in ("train.jsonl", "rl_lab_verifier.py")
               if not os.path.isfile(os.path.join(args.data, name))]
    if missing:
        parser.error(f"argument --data: {args.data} has no {' and no '.join(missing)}; write the folder with: python "
                     f"online_tokens.py --task {TASK} --export-data {args.data}")
    if os.path.lexists(args.output) and not os.path.isdir(args.output):
        parser.error(f"argument --output: {args.output} exists and is not a folder")
    if args.model is not None:  # the tokenizer loads in a moment: a wrong name fails here, not after the data
        try:
            AutoTokenizer.from_pretrained(args.model)
        except (OSError, ValueError) as error:  # no such folder or name, no network, a folder without a tokenizer
            parser.error(f"argument --model: {args.model}: {error}")
    make_trainer(args.output, args.steps, data=args.data, model_name=args.model, vllm=args.vllm).train()


if __name__ == "__main__":
    main()
'''


# verl trains a pretrained model on GPUs: the model the export names when --model is not given
VERL_MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
# the data folder when --export-data-dir is not given: `data`, as the TRL script's --data, made absolute by the
# shell ($PWD) because verl's Ray workers load the verifier from that path
VERL_DATA = "$PWD/data"
VERL_DATA_COMMAND = "python online_tokens.py --task {task} --export-data DIR"
GPUS_PER_NODE = 8
# A real model's numbers: (value, why). The lab's own are set for a table or a tiny transformer on a CPU.
ACTOR_LR = (1e-6, "verl's default and its GRPO examples' for 0.5B-7B instruct models: the lab's rate moves a "
                  "table of logits or a tiny transformer and would wreck a pretrained model within a few steps")
CRITIC_LR = (1e-5, "verl's default: the critic's value head starts from scratch, so it learns faster than the actor")
PROMPTS = (128, f"prompts per step: {GPUS_PER_NODE} GPUs need many sequences at once to stay busy (at most the "
                "task's train prompts: verl's epoch goes through them without replacement and drops the last "
                "partial batch); one mini-batch of the whole batch keeps the "
                "lab's one Adam step per update")
RESPONSE_TOKENS = (256, "a BPE tokenizer and a chat model write the answer in words and spaces: room to finish "
                        "(the TRL script's too), while the verifier still scores only the exact answer; the lab's cap "
                        "counts its own one-character tokens")
PROMPT_TOKENS = (512, "the chat template, the instruction and the numbers; data.truncation=error stops the run if "
                      "a prompt is longer")
MICRO_BATCH = (8, "sequences one GPU holds for a gradient (16 for a forward pass): memory only, the gradient is "
                  "accumulated, so the loss does not change; lower them if a GPU runs out of memory")
LOG_PROB_MICRO_BATCH = 16
VALIDATION_SAMPLES = (16, "responses per prompt at the lab's temperature: verl logs best@k for k = 2, 4, 8, 16, the "
                          "best of k of these responses drawn with replacement (a bootstrap), which lies below the "
                          "unbiased pass@k the lab reports; raise it well above k to compare the two")
TEST_EVERY = (10, "steps between validations")
# A run whose loss or advantage verl lacks is refused (verl would train another algorithm under its name); a
# switch verl lacks is named in the header
CORE = ("algorithm", "advantage")
# What the lab's settings of its own policy become, or why they have no place in verl: {setting: reason}
NOT_CARRIED = {
    "policy": "verl trains the model above; the lab's table or tiny transformer has no verl form",
    "dtype": "bf16 forward passes with fp32 master weights and a bf16 vLLM: verl's defaults for GPUs, kept",
    "sampler_dtype": "vLLM samples in bf16 (verl's default); --tis-cap / rollout_is corrects the mismatch",
    "position_ids": "verl numbers a left-padded batch's positions from the attention mask (the lab's mask)",
    "use_cache": "vLLM always samples with its KV cache",
    "sft_steps": "verl starts from the model's own weights: an instruct model needs no warm start",
    "sft_folder": "no SFT model to cache",
    "sft_seed": "no warm start to seed (the data loader and rollout take the lab's --seed)",
    "eval_prompts": "the lab's exact success probability sums over every response; verl can only sample "
                    "(validation on every test prompt, see val_kwargs)",
    "eval_samples": "verl samples actor_rollout_ref.rollout.val_kwargs.n responses per test prompt",
    "value_coef": "verl trains the critic as its own model with its own optimizer: no weight between the losses",
}


def _shown(value):
    """A value as Hydra's override grammar reads it back."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return repr(value) if isinstance(value, float) else str(value)


def _override(key, value):
    """key=value as one word of the shell: quoted unless it is made of characters the shell leaves alone
    (a Hydra list would be a glob pattern; a --model or --export-data-dir of the user's may hold a space,
    a ';' or a quote). $ stays unquoted: the default data folder is $PWD/data."""
    text = f"{key}={_shown(value)}"
    return text if re.fullmatch(r"[\w.,:/@%+=$-]+", text) else shlex.quote(text)


def _real_model(settings, options):
    """The overrides that scale the lab's run to a pretrained model on one node: {key: (value, the lab's
    value or None, why)}, applied over the map's options."""
    s, actor = settings, "actor_rollout_ref.actor."
    prompts = min(PROMPTS[0], train_prompts(s))
    scaled = {
        actor + "optim.lr": (ACTOR_LR[0], s["learning_rate"], ACTOR_LR[1]),
        "data.train_batch_size": (prompts, s["prompts"], PROMPTS[1]),
        actor + "ppo_mini_batch_size": (prompts, s["prompts"], "= data.train_batch_size: one optimizer step "
                                                               "per update, as the lab's"),
        "data.max_response_length": (RESPONSE_TOKENS[0], s["max_new_tokens"], RESPONSE_TOKENS[1]),
        "data.max_prompt_length": (PROMPT_TOKENS[0], None, PROMPT_TOKENS[1]),
    }
    if actor + "loss_scale_factor" in options:  # Dr. GRPO divides by the cap: the new one
        scaled[actor + "loss_scale_factor"] = (RESPONSE_TOKENS[0], s["max_new_tokens"], "= data.max_response_length")
    if "+reward.reward_kwargs.max_resp_len" in options:  # DAPO's overlong buffer: the same share of the cap
        cache = round(s["overlong_penalty"] * RESPONSE_TOKENS[0] / s["max_new_tokens"])
        scaled["+reward.reward_kwargs.max_resp_len"] = (RESPONSE_TOKENS[0], s["max_new_tokens"],
                                                        "= data.max_response_length")
        scaled["+reward.reward_kwargs.overlong_buffer_cfg.len"] = (
            cache, s["overlong_penalty"], f"the same share of the cap as the lab's {s['overlong_penalty']} of "
                                          f"{s['max_new_tokens']}")
    if s["algorithm"] == "ppo":
        scaled["critic.optim.lr"] = (CRITIC_LR[0], None, CRITIC_LR[1])
    return scaled


def train_prompts(settings):
    """How many train prompts the run's task has (the rows of --export-data's train.parquet)."""
    from tasks import TASKS  # the task's own count; nothing is trained

    return TASKS[settings["task"]](settings["max_new_tokens"]).prompt_count("train")


def _inputs(model, data_dir):
    """The launch's data, verifier and model: {key: value}."""
    return {"data.train_files": f"{data_dir}/train.parquet", "data.val_files": f"{data_dir}/test.parquet",
            # verl 0.9's key (the top-level custom_reward_function is its legacy name, moved here at start-up)
            "reward.custom_reward_function.path": f"{data_dir}/rl_lab_verifier.py",
            "reward.custom_reward_function.name": "compute_score",
            "actor_rollout_ref.model.path": model}


def _launch(settings, model):
    """The overrides every launch needs beside the map's: the node, micro-batches, vLLM, the run's length,
    seeds, schedule, weight decay and validation (and PPO's critic); {key: value}."""
    s, actor, rollout = settings, "actor_rollout_ref.actor.", "actor_rollout_ref.rollout."
    launch = {
        "trainer.nnodes": 1, "trainer.n_gpus_per_node": GPUS_PER_NODE, "trainer.logger": '["console"]',
        "trainer.project_name": "rl_lab", "trainer.experiment_name": f"{s['algorithm']}-{s['task']}",
        "trainer.total_training_steps": s["steps"], "trainer.total_epochs": s["steps"],
        "trainer.test_freq": TEST_EVERY[0],
        actor + "ppo_micro_batch_size_per_gpu": MICRO_BATCH[0],
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": LOG_PROB_MICRO_BATCH,
        rollout + "log_prob_micro_batch_size_per_gpu": LOG_PROB_MICRO_BATCH,
        rollout + "name": "vllm", rollout + "tensor_model_parallel_size": 1,
        rollout + "val_kwargs.n": VALIDATION_SAMPLES[0], rollout + "val_kwargs.do_sample": True,
        rollout + "val_kwargs.temperature": s["temperature"],
        "data.seed": s["seed"], rollout + "seed": s["seed"], actor + "data_loader_seed": s["seed"],
        actor + "optim.lr_scheduler_type": "constant", actor + "optim.lr_warmup_steps": 0,
        actor + "optim.weight_decay": 0.0,
    }
    if s["algorithm"] == "ppo":
        launch.update({"critic.model.path": model, "critic.ppo_micro_batch_size_per_gpu": MICRO_BATCH[0],
                       "critic.optim.lr_scheduler_type": "constant", "critic.optim.lr_warmup_steps": 0,
                       "critic.optim.weight_decay": 0.0, "critic.data_loader_seed": s["seed"]})
    return launch


def export_verl(settings, model=None, data_dir=None):
    """The verl 0.9.1 launch command (python3 -m verl.trainer.main_ppo with Hydra overrides) of these
    settings on `model` (None: VERL_MODEL) with the data and verifier of `data_dir` (None: VERL_DATA), a
    shell script whose header names what verl does differently, what is set for a real model and why,
    and every setting of the lab's that is not carried. Raises ValueError for DPO (verl 0.9.1 has no DPO
    trainer), for a loss or an advantage verl lacks (CORE) and for settings that are not a resolved
    settings dict."""
    from online_settings import BY_NAME  # only the declarations; nothing is trained

    _check_settings(settings)
    block = library_blocks(settings)["verl"]
    if block["options"] is None:
        raise ValueError(f"algorithm: {block['reason']}; verl 0.9.1's main_ppo trains the PPO family only, so "
                         f"{settings['algorithm']} is not exported to verl")
    for key, reason in block["unmatched"].items():
        if key.split("=")[0] in CORE:  # verl would train another algorithm under the lab's name
            raise ValueError(f"{key.split('=')[0]}: {reason}, so {key.split('=')[1]} is not exported to verl")
    model = VERL_MODEL if model is None else model
    data_dir = VERL_DATA if data_dir is None else data_dir
    scaled = _real_model(settings, block["options"])
    # the inputs first, then the algorithm (the map's options, a real model's values in their places), then the node
    real = {key: value for key, (value, _, _) in scaled.items()}
    overrides = {**_inputs(model, data_dir), **block["options"], **real, **_launch(settings, model)}
    header = [
        f"# verl 0.9.1 launch of the lab's `python online_tokens.py {_flags(settings)}`",
        f"# on {model}, one node of {GPUS_PER_NODE} GPUs. The data and the verifier come from",
        f"#   {VERL_DATA_COMMAND.format(task=settings['task'])}",
        f"# (DIR/train.parquet, DIR/test.parquet, DIR/rl_lab_verifier.py); DIR here: {data_dir}.",
        f"# verl's epoch draws each of the task's {train_prompts(settings)} train prompts once, "
        "data.train_batch_size a step",
        "# (the lab draws its prompts with replacement).",
        "#",
        "# What verl does differently from the lab (library_map.py):",
        *_comment_lines(block),
        "# Set for a real model (the lab's value -> this run's: why):",
        *[f"#   {key}: {'-' if lab is None else _shown(lab)} -> {_shown(value)}: {why}"
          for key, (value, lab, why) in scaled.items()],
        f"#   micro-batches {MICRO_BATCH[0]} (update) and {LOG_PROB_MICRO_BATCH} (log-probs) per GPU: {MICRO_BATCH[1]}",
        "#   rollout.name=vllm with tensor_model_parallel_size=1: a model under about 7B fits one GPU; raise it for a "
        "larger one",
        f"#   validation on test.parquet before training and every {TEST_EVERY[0]} steps, "
        f"{VALIDATION_SAMPLES[0]} {VALIDATION_SAMPLES[1]}",
        "#   trainer.logger=[console]: wandb needs an account (add it back to log there)",
        "# The same as the lab's run:",
        f"#   trainer.total_training_steps={settings['steps']} (--steps): a step samples the batch and takes "
        f"--updates-per-batch ({settings['updates_per_batch']}) optimizer steps, as the lab's iteration; "
        "total_epochs as many, so the step count ends the run",
        f"#   --seed {settings['seed']}: data.seed, rollout.seed, data_loader_seed (verl's random streams are not "
        "the lab's: the same seed draws other samples)",
        "#   a constant learning rate without warm-up and weight decay 0 (the lab's Adam; verl's AdamW defaults to "
        "0.01)",
        "# Not carried (the lab's settings of its own policy and evaluation):",
        *[f"#   {_given(BY_NAME[name], settings[name])}: {reason}" for name, reason in NOT_CARRIED.items()
          if _applies(BY_NAME[name], settings)],
    ]
    # the list items are wrapped; the command lines above them stay whole, to be copied
    header = [wrapped for line in header for wrapped in (_wrapped(line) if line.startswith("#   ") else [line])]
    items = list(overrides.items())
    lines = ["python3 -m verl.trainer.main_ppo \\"]
    lines += [f"    {_override(key, value)}" + (" \\" if index < len(items) - 1 else "")
              for index, (key, value) in enumerate(items)]
    return "\n".join(header + lines) + "\n"


def _given(item, value):
    """How the lab's command line gives this value: '--sft-steps 1500', '--no-cache not given'."""
    if item.kind == "bool":
        return f"{item.option} {'given' if value != item.default else 'not given'}"
    return f"{item.option} not given" if value is None else f"{item.option} {_shown(value)}"


def _applies(item, settings):
    """Whether a setting applies to this run's algorithm and policy (its value changes the lab's run)."""
    from online_settings import APPLIES  # only the declarations; nothing is trained

    return settings["algorithm"] in APPLIES[item.name] and (item.policies is None or
                                                              settings["policy"] in item.policies)


def _wrapped(comment, width=110):
    """A comment line wrapped to `width` characters, its continuation lines indented under its text."""
    if len(comment) <= width:
        return [comment]
    indent = "#" + " " * (len(comment[1:]) - len(comment[1:].lstrip()) + 2)
    return textwrap.wrap(comment, width, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False)
