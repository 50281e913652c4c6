"""A task's prompts as the files TRL and verl read: JSONL for `datasets`, parquet in verl's schema, and
the text verifier beside them.

    python online_tokens.py --task countdown --export-data data/countdown   # 4 data files + rl_lab_verifier.py
    python online_tokens.py --task binary --export-data data/binary

DIR/train.jsonl, DIR/test.jsonl: one JSON object a line, `datasets.load_dataset("json", ...)`-loadable:
    prompt       the lab's prompt as plain text, the characters of its tokens without BOS ("1234:1=", "5"):
                 what the exported TRL script's character tokenizer reads as the lab's own tokens
    instruction  the same task in words, for a pretrained instruct model (the TRL script's --model)
    the answer data, in the columns text_verifier.reward_func reads: binary `number`; Countdown
                 `numbers`, `target`, `operators`, `partial_credit`
    solution     one correct response's text (the SFT warm start of the TRL script's tiny model)
    split, index the split and the lab's global prompt index
DIR/train.parquet, DIR/test.parquet: verl's schema, `data_source` ("rl_lab/binary", "rl_lab/countdown"),
`prompt` = [{"role": "user", "content": instruction}], `ability`, `reward_model` = {"style": "rule",
"ground_truth": the answer data as JSON text}, `extra_info` = {"split", "index"}. Written with pyarrow,
which only the bridge's requirements install: without it the export exits 2 and writes nothing.
DIR/rl_lab_verifier.py: a copy of text_verifier.py (standard library only): TRL's reward_funcs, verl's
custom_reward_function (compute_score).

The binary task holds no prompt out (the lab evaluates its six train prompts exactly), so its test files
hold those six prompts again; verl needs a validation file.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os

DATA_FILES = ("train.jsonl", "test.jsonl", "train.parquet", "test.parquet", "rl_lab_verifier.py")
VERIFIER_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "text_verifier.py")
ABILITY = {"binary": "binary", "countdown": "arithmetic"}


PYARROW_NEEDED = ("pyarrow is needed for the parquet files: run this with the bridge's venv (.venv-bridge/bin/python, "
                  "see requirements-bridge.txt) or add pyarrow alone to this one (pip install pyarrow)")


class PyarrowMissing(Exception):
    """pyarrow is not importable: the parquet files cannot be written."""


def pyarrow_missing():
    """True when pyarrow cannot be imported (the lab's own venv): checked before any work."""
    return importlib.util.find_spec("pyarrow") is None


def answer_columns(task, prompt):
    """{column: value} the text verifier reads for the lab's prompt index `prompt` of `task`."""
    if task.name == "binary":
        return {"number": int(prompt)}
    return {"numbers": list(task.prompt_numbers(prompt)), "target": task.prompt_target(prompt),
            "operators": task.operators, "partial_credit": task.config.partial_credit}


def instruction(task, prompt):
    """The prompt in words, for a model that was not trained on the lab's compact format."""
    if task.name == "binary":
        return f"Write the number {int(prompt)} in binary. Answer with the binary digits only."
    numbers = ", ".join(str(number) for number in task.prompt_numbers(prompt))
    operators = " and ".join(task.operators)
    return (f"Using some of the numbers {numbers} (at least two, each at most once) and the operators {operators}, "
            f"write an expression equal to {task.prompt_target(prompt)}. Answer with the expression only.")


def prompt_text(task, prompt):
    """The lab's prompt as text, without BOS: its tokens' strings joined ("1234:1=" or "5")."""
    if task.name == "binary":
        return str(int(prompt))
    return task.decode(task.prompt_tokens([prompt])[0][1:])  # the tokenizer adds BOS itself


def solution_text(task, prompt):
    """The text of the lab's first correct response of `prompt`, without EOS."""
    return "".join(task.vocab[token] for token in task.solutions(prompt)[0][:-1])


def rows(task, split):
    """The JSONL rows of `split` (dicts in a fixed key order). The binary task's test rows are its train
    prompts (it has no held-out prompt)."""
    source = split if task.prompt_count(split) > 0 else "train"
    return [{"prompt": prompt_text(task, prompt), "instruction": instruction(task, prompt),
             **answer_columns(task, prompt), "solution": solution_text(task, prompt), "split": split, "index": prompt}
            for prompt in task.split_prompts(source).tolist()]


def jsonl_text(records):
    return "".join(json.dumps(record) + "\n" for record in records)


def verl_records(task, records):
    """verl's rows of these JSONL rows."""
    names = list(answer_columns(task, records[0]["index"])) if records else []
    return [{"data_source": f"rl_lab/{task.name}", "prompt": [{"role": "user", "content": record["instruction"]}],
             "ability": ABILITY[task.name],
             "reward_model": {"style": "rule", "ground_truth": json.dumps({name: record[name] for name in names})},
             "extra_info": {"split": record["split"], "index": record["index"]}} for record in records]


def parquet_bytes(records):
    """The parquet file of verl's rows, as bytes (pyarrow, imported here: only the bridge installs it)."""
    if pyarrow_missing():
        raise PyarrowMissing(PYARROW_NEEDED)
    import pyarrow
    import pyarrow.parquet

    message = pyarrow.struct([("role", pyarrow.string()), ("content", pyarrow.string())])
    schema = pyarrow.schema([
        ("data_source", pyarrow.string()), ("prompt", pyarrow.list_(message)), ("ability", pyarrow.string()),
        ("reward_model", pyarrow.struct([("style", pyarrow.string()), ("ground_truth", pyarrow.string())])),
        ("extra_info", pyarrow.struct([("split", pyarrow.string()), ("index", pyarrow.int64())])),
    ])
    buffer = io.BytesIO()
    pyarrow.parquet.write_table(pyarrow.Table.from_pylist(records, schema=schema), buffer)
    return buffer.getvalue()


def data_files(task, folder):
    """{path: text or bytes} of the export into `folder`; raises PyarrowMissing without pyarrow."""
    files = {}
    for split in ("train", "test"):
        records = rows(task, split)
        files[os.path.join(folder, f"{split}.jsonl")] = jsonl_text(records)
        files[os.path.join(folder, f"{split}.parquet")] = parquet_bytes(verl_records(task, records))
    with open(VERIFIER_SOURCE, encoding="utf-8") as handle:
        files[os.path.join(folder, "rl_lab_verifier.py")] = handle.read()
    return files
