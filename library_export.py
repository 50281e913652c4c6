"""A lab run's settings as a TRL script or a verl launch command: the way out of the lab, written from
library_map's blocks. Neither TRL nor verl is imported: the online driver can offer it without the extra.

    export_trl(settings)                          -> the text of a runnable TRL 1.16 script (the GRPO family)
    export_verl(settings, model=None, data_dir=None) -> a shell script: verl 0.9.1's main_ppo and its overrides

`settings` is the dict the online driver passes to library_map.library_blocks (its resolved settings
plus max_grad_norm). The TRL script trains a tiny causal LM built from a config, with a character
tokenizer built locally (nothing is downloaded), on the lab's task (the prompt n, the answer n in
binary then EOS) with the lab's verifier as its reward function; a comment says what to change to
scale up. A run on another task (--task countdown) is refused by the TRL export: its script would hold
the wrong dataset and verifier. `python bridge.py e2e` runs such a script and recomputes TRL's loss with
the lab's atoms.

The verl command trains a pretrained model (--model; default VERL_MODEL) on one node, on the parquet
files and the text verifier that `online_tokens.py --export-data DIR` writes (--export-data-dir). It
passes verl's own start-up checks as written: the micro-batch sizes, rollout.name, PPO's critic model
(test_bridge.VerlLaunch runs main_ppo up to ray.init on every export). Its header says what verl does
differently (library_map's block), each value set for a real model with its reason (learning rate,
batch, lengths), what stays the lab's (steps, seeds, a constant learning rate, weight decay 0) and
every setting of the lab's own policy that does not carry. DPO (verl has no DPO trainer) and a loss or
an advantage verl lacks are refused: the command would train another algorithm.
"""

from __future__ import annotations

import dataclasses
import json
import textwrap

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
                "task's train prompts: verl's epoch draws each once); one mini-batch of the whole batch keeps the "
                "lab's one Adam step per update")
RESPONSE_TOKENS = (256, "a BPE tokenizer and a chat model write the answer in words and spaces: room to finish "
                        "(the TRL script's too), while the verifier still scores only the exact answer; the lab's cap "
                        "counts its own one-character tokens")
PROMPT_TOKENS = (512, "the chat template, the instruction and the numbers; data.truncation=error stops the run if "
                      "a prompt is longer")
MICRO_BATCH = (8, "sequences one GPU holds for a gradient (16 for a forward pass): memory only, the gradient is "
                  "accumulated, so the loss does not change; lower them if a GPU runs out of memory")
LOG_PROB_MICRO_BATCH = 16
VALIDATION_SAMPLES = (16, "responses per prompt at the lab's temperature: verl logs best@k (pass@k of a 0/1 "
                          "reward) for k = 2, 4, 8, 16")
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
    text = f"{key}={_shown(value)}"
    return f"'{text}'" if "[" in text else text  # a Hydra list would be a glob pattern to the shell


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
