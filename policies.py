"""The online driver's policies, behind one small interface, and the lookup-table policy.

The online loop talks to a policy only through these members (a transformer with a KV cache, left-padded
prompts and a sampler in another precision fits behind the same ones):

    sample(prompts, generator, temperature=None, top_p=None) -> Samples
        responses to prompts (N,) (global prompt indices of the task), drawn token by token without
        gradient, and the log-prob the sampler gave each sampled token
    logits(prompts, completion_ids, positions=None) -> (N, R, V)
        the trainer's tempered next-token logits at every completion position (teacher forcing), with
        gradient: the log-probs, ratios and entropies of the loop all come from these (the exact
        evaluation asks for positions="mask", the sampler's numbering)
    parameters(), snapshot()
        the trainable tensors; a frozen copy (the old policy before each batch, the reference)
    critic(cap_value) -> a value function with parameters() and values(prompts, completion_ids)
        what PPO trains beside the policy
    exact, description
        whether the policy is evaluated exactly (a table: response_kl below) or on a fixed draw of prompts
        (a transformer: sample_evaluation below); one line for the run's settings
    response_kl(reference) -> float   (exact policies only)
        KL(policy || reference) over whole responses, in nats, averaged over the task's prompts
    sample_evaluation(split, samples, generator) -> dict   (the others)
        sampled pass@k and its companions on a split's prompts (sft.sample_evaluation)

Shape notation: N responses, R completion positions (max_new_tokens), V vocabulary, P prompts of the
task, S = V + 1 previous-token states (the vocabulary and the start).
"""

from __future__ import annotations

import copy
import dataclasses
import weakref
from dataclasses import dataclass

import torch

from lab.checks import check_tensor
import sft
from tasks import TASKS
from tiny_lm import TinyLM, generate, shared_prompt_logits

DTYPE = torch.float64
DEVICE = torch.device("cpu")


@dataclass
class Samples:
    """What sampling returns, all without gradient.

    completion_ids (N, R) int64, PAD after the first EOS; real (N, R) bool, True up to and including the
    first EOS; truncated (N,) bool, the response hit R tokens without an EOS; sampler_logps (N, R), the
    log-prob of each sampled token under the distribution it was drawn from (after temperature and
    top-p), 0 past the end."""

    completion_ids: torch.Tensor
    real: torch.Tensor
    truncated: torch.Tensor
    sampler_logps: torch.Tensor


def nucleus(probs, top_p):
    """(N, V) probabilities restricted to the smallest set of most likely tokens whose mass reaches
    top_p (the token that crosses it included), renormalized: top-p sampling (Holtzman et al. 2019,
    arXiv 1904.09751, sec. 3.1)."""
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    before = sorted_probs.cumsum(dim=-1) - sorted_probs  # mass of the tokens ranked above each one
    keep_sorted = before < top_p
    keep_sorted[..., 0] = True  # the most likely token always: a top_p below the dtype's smallest number reads as 0
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    kept = torch.where(keep, probs, torch.zeros_like(probs))
    return kept / kept.sum(dim=-1, keepdim=True)


def logps_of_tokens(logits, completion_ids):
    """(N, R) log-prob of each token in completion_ids under (N, R, V) logits."""
    logp = torch.log_softmax(logits, dim=-1)  # (N, R, V)
    return logp.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)  # (N, R, 1) -> (N, R)


def entropies(logits):
    """(N, R) entropy in nats of each position's next-token distribution, from (N, R, V) logits."""
    logp = torch.log_softmax(logits, dim=-1)  # (N, R, V)
    probs = logp.exp()
    return -torch.where(probs > 0, probs * logp, 0.0).sum(dim=-1)  # 0 log 0 = 0, also where logp is -inf


# ---------------------------------------------------------------------------------------------
# The lookup-table policy
# ---------------------------------------------------------------------------------------------
# Indexed by (prompt, position, previous token): the previous token is what an autoregressive model
# conditions on; the position lets the table write "11" and "100", whose repeated digits a
# previous-token-only table could not tell apart. It shares nothing across prompts or positions.


def previous_tokens(completion_ids, bos_state):
    """(N, R) the token before each completion position; position 0's is the start state."""
    bos = torch.full((completion_ids.shape[0], 1), bos_state, dtype=torch.long, device=DEVICE)
    return torch.cat([bos, completion_ids[:, :-1]], dim=1)


class TablePolicy:
    """A table of next-token logits (P, R, S, V), tempered by the trainer's temperature.

    Sampling and scoring index the same table with the same temperature, so a snapshot's log-probs of its
    own samples equal the scored ones bit for bit (the ratio is exactly 1 before the first update)."""

    description = "table of logits (prompt, position, previous token) -> next token, zeros at start (uniform)"
    exact = True  # small enough to evaluate exactly on every prompt, its KL to the reference included

    def __init__(self, table, temperature, eos_id):
        self.table, self.temperature, self.eos_id = table, temperature, eos_id
        self.bos_state = table.shape[2] - 1  # the last state: no token yet

    @classmethod
    def uniform(cls, task, max_new_tokens, temperature):
        """All-zero logits (a uniform policy) for `task`, trainable."""
        shape = (task.prompt_count("train"), max_new_tokens, len(task.vocab) + 1, len(task.vocab))
        return cls(torch.zeros(shape, dtype=DTYPE, device=DEVICE, requires_grad=True), temperature, task.eos_id)

    def parameters(self):
        return [self.table]

    def snapshot(self):
        """A frozen copy: the old policy that samples a batch, or the reference."""
        return TablePolicy(self.table.detach().clone(), self.temperature, self.eos_id)

    def _next_logits(self, prompts, positions, previous, temperature):
        return self.table[prompts, positions, previous] / temperature  # (..., V)

    def logits(self, prompts, completion_ids, positions=None):
        """(N, R, V) tempered logits at every completion position, given the tokens before it (teacher forcing).

        prompts (N,) int64; completion_ids (N, L) int64 with L <= R. positions: unused (a table indexes the
        position itself; see TransformerPolicy.logits)."""
        count, length = completion_ids.shape
        positions = torch.arange(length, device=DEVICE).expand(count, length)  # (L,) -> (N, L)
        previous = previous_tokens(completion_ids, self.bos_state)
        return self._next_logits(prompts.unsqueeze(1), positions, previous, self.temperature)

    def sample(self, prompts, generator, temperature=None, top_p=None):
        """One completion per prompt, token by token (see `Samples`); temperature and top_p default to
        the trainer's (1 and off): other values make a sampler that differs from the trainer."""
        temperature = self.temperature if temperature is None else temperature
        count, length = prompts.shape[0], self.table.shape[1]
        completion_ids = torch.full((count, length), self.eos_id, dtype=torch.long, device=DEVICE)
        real = torch.zeros(count, length, dtype=torch.bool, device=DEVICE)
        sampler_logps = torch.zeros(count, length, dtype=self.table.dtype)
        previous = torch.full((count,), self.bos_state, dtype=torch.long, device=DEVICE)
        finished = torch.zeros(count, dtype=torch.bool, device=DEVICE)
        with torch.no_grad():
            for position in range(length):
                positions = torch.full((count,), position, dtype=torch.long, device=DEVICE)
                probs = torch.softmax(self._next_logits(prompts, positions, previous, temperature), dim=-1)  # (N, V)
                if top_p is not None:
                    probs = nucleus(probs, top_p)
                tokens = torch.multinomial(probs, 1, generator=generator).squeeze(1)  # (N, 1) -> (N,)
                chosen = probs.gather(1, tokens.unsqueeze(1)).squeeze(1).log()
                sampler_logps[:, position] = torch.where(finished, torch.zeros_like(chosen), chosen)
                tokens = torch.where(finished, torch.full_like(tokens, self.eos_id), tokens)  # PAD after the EOS
                real[:, position] = ~finished
                completion_ids[:, position] = tokens
                finished = finished | (tokens == self.eos_id)
                previous = tokens
        return Samples(completion_ids, real, ~finished, sampler_logps)

    def critic(self, cap_value):
        return TableCritic(self.table.shape, self.bos_state, cap_value)

    def response_kl(self, reference):
        """Exact KL(policy || reference) between the two distributions over whole responses, in nats,
        averaged over the prompts: by the chain rule, the sum over positions of each state's categorical
        KL weighted by the probability that the policy reaches that state (no sampling). The same
        temperature tempers both, as in training."""
        table, temperature = self.table.detach(), self.temperature
        with torch.no_grad():
            logp = torch.log_softmax(table / temperature, dim=-1)  # (P, R, S, V)
            ref_logp = torch.log_softmax(reference.table / temperature, dim=-1)
            kl_state = (logp.exp() * (logp - ref_logp)).sum(dim=-1)  # (P, R, S)
            reach = torch.zeros(table.shape[0], table.shape[2], dtype=table.dtype)  # (P, S): p(state at position t)
            reach[:, self.bos_state] = 1.0
            total = torch.zeros(table.shape[0], dtype=table.dtype)
            for position in range(table.shape[1]):
                total = total + (reach * kl_state[:, position]).sum(dim=1)
                flow = (reach.unsqueeze(-1) * logp[:, position].exp()).sum(dim=1)  # (P, V): p(next token)
                reach = torch.zeros_like(reach)
                reach[:, : table.shape[3]] = flow
                reach[:, self.eos_id] = 0.0  # an EOS ends the response: nothing follows it
            return total.mean().item()

    def check(self, name="table"):
        check_tensor(name, self.table, ndim=4)
        return self


class TableCritic:
    """PPO's critic for the table policy: V(prompt, position, previous token), a (P, R+1, S) table of
    zeros at the start; row R is the state after the cap.

    cap_value "table": the state after the cap has its own row, which no response ever acts in, so it
    keeps its initial 0. "shared": it takes the last position's entry for the same prompt and previous
    token, what a critic that shares its estimate across positions (as a language model's value head
    does) gives."""

    def __init__(self, table_shape, bos_state, cap_value):
        prompts, length, states, _ = table_shape
        self.table = torch.zeros((prompts, length + 1, states), dtype=DTYPE, device=DEVICE, requires_grad=True)
        self.bos_state, self.cap_value = bos_state, cap_value
        self.description = ("table of values (prompt, position, previous token), zeros at start, same Adam step")
        self.after_cap = (
            "its own row of the critic table, which no response ever acts in: it keeps its initial 0"
            if cap_value == "table" else
            "the critic's last-position entry for the same prompt and previous token (a critic that shares "
            "across positions)")

    def parameters(self):
        return [self.table]

    def values(self, prompts, completion_ids):
        """(N, R) V(s_t) of every completion position and (N,) V of the state after the cap, with gradient."""
        count, length = completion_ids.shape
        positions = torch.arange(length, device=DEVICE).expand(count, length)  # (R,) -> (N, R)
        values = self.table[prompts.unsqueeze(1), positions, previous_tokens(completion_ids, self.bos_state)]
        cap_position = length if self.cap_value == "table" else length - 1
        after_cap = self.table[prompts, cap_position, completion_ids[:, -1]]  # (N,)
        return values, after_cap


# ---------------------------------------------------------------------------------------------
# The transformer policy
# ---------------------------------------------------------------------------------------------
# A tiny decoder-only language model (tiny_lm.py) shares its parameters across prompts and positions, so
# what it learns on one prompt moves every other: it can generalize to a prompt it never trained on, and
# it can also lose the diversity of its answers. It samples left-padded prompts with a KV cache, possibly
# in a lower precision than it trains in, as an inference engine does.


_PROMPT_TABLES = weakref.WeakKeyDictionary()  # task -> prompt_table(task), while the task lives


def prompt_table(task):
    """((M, P) int64 ids, (M, P) int64 attention mask): every prompt of the task (both splits, M of them)
    left-padded by sft.prompt_batch, built once per task object: a run's policy, reference and snapshots,
    and every run of one task in a process, share it (it is never written to). A task of 20k prompts
    takes a third of a second to build."""
    if task not in _PROMPT_TABLES:
        _PROMPT_TABLES[task] = sft.prompt_batch(task, list(range(task.prompt_count("train")
                                                                  + task.prompt_count("test"))))
    return _PROMPT_TABLES[task]


class TransformerPolicy:
    """A TinyLM behind the policy interface. prompts are the task's global prompt indices: the policy
    turns them into left-padded token batches itself. It samples with `tiny_lm.generate` (KV cache,
    `sampler_dtype`) and scores with one full forward pass in its own dtype (the trainer's numbers)."""

    description = ("tiny decoder-only transformer (tiny_lm.py): learned positions from the attention mask, "
                   "pre-LayerNorm blocks, warm-started by supervised fine-tuning on the task's demonstrations")
    exact = False  # evaluated exactly on a fixed draw of prompts; its KL to the reference estimated on batches

    def __init__(self, model, task, temperature, max_new_tokens, sampler_dtype=None, use_cache=True,
                 position_ids="mask"):
        self.model, self.task, self.temperature = model, task, temperature
        self.max_new_tokens, self.sampler_dtype, self.use_cache = max_new_tokens, sampler_dtype, use_cache
        self.position_ids = position_ids  # how the trainer numbers positions: "mask" (right) or "arange" (the bug)

    def parameters(self):
        return list(self.model.parameters())

    def snapshot(self):
        """A frozen copy (no gradient, eval mode)."""
        model = copy.deepcopy(self.model).eval().requires_grad_(False)
        return TransformerPolicy(model, self.task, self.temperature, self.max_new_tokens, self.sampler_dtype,
                                 self.use_cache, self.position_ids)

    def prompt_batch(self, prompts):
        """(N, P) int64 prompt tokens left-padded with PAD and their (N, P) int64 attention mask: the
        first real token of every row then has position 0 (position ids come from the mask). P is the
        longest of these prompts: rows of one table of every prompt of the task, cut to that width."""
        ids, mask = prompt_table(self.task)  # (all prompts, longest width)
        width = int(mask[prompts].sum(dim=1).max())
        return ids[prompts, ids.shape[1] - width:], mask[prompts, ids.shape[1] - width:]

    def sample(self, prompts, generator, temperature=None, top_p=None):
        """One completion per prompt (see `Samples`), from the KV-cache sampler in `sampler_dtype`."""
        ids, mask = self.prompt_batch(prompts)
        out = generate(self.model, ids, mask, self.max_new_tokens, eos_id=self.task.eos_id, pad_id=self.task.pad_id,
                       temperature=self.temperature if temperature is None else temperature,
                       top_p=1.0 if top_p is None else top_p, generator=generator, use_cache=self.use_cache,
                       dtype=self.sampler_dtype)
        width = ids.shape[1]
        completion_ids = torch.full((len(ids), self.max_new_tokens), self.task.pad_id, dtype=torch.long)
        real = torch.zeros(len(ids), self.max_new_tokens, dtype=torch.bool)
        sampled = out.sequences.shape[1] - width  # the sampler stops once every row has ended
        completion_ids[:, :sampled] = out.sequences[:, width:]
        real[:, :sampled] = out.completion_mask[:, width:].bool()
        return Samples(completion_ids, real, out.truncated, out.log_probs)

    def logits(self, prompts, completion_ids, positions=None):
        """(N, R, V) tempered logits at every completion position, from one forward pass over prompt and
        completion: row t is predicted from the hidden state of the token before completion token t.
        Tokens after a response's EOS are attended to only by later positions, which no loss counts.
        positions: how to number the positions, "mask" (cumsum of the attention mask - 1: a left-padded
        prompt's first real token is position 0, as the sampler numbers them) or "arange" (0..T-1 in
        every row: the left-padding bug); None is the trainer's own setting."""
        ids, mask = self.prompt_batch(prompts)
        width, length = ids.shape[1], completion_ids.shape[1]
        sequences = torch.cat([ids, completion_ids], dim=1)  # (N, P + R)
        attention = torch.cat([mask, torch.ones_like(completion_ids)], dim=1)
        position_ids = self._position_ids(attention, positions)
        # each distinct prompt runs once (a group's G responses share it), with or without gradient
        logits = shared_prompt_logits(self.model, sequences, attention, width, position_ids)  # (N, R, V)
        return logits / self.temperature

    def _position_ids(self, attention, positions=None):
        """None (the model numbers positions from the mask) or the bug's arange positions (N, T)."""
        if (positions or self.position_ids) == "mask":
            return None
        return torch.arange(attention.shape[1]).expand_as(attention)  # (T,) -> (N, T): ignores the padding

    def critic(self, cap_value):
        return TransformerCritic(self)

    def sample_evaluation(self, split, samples, generator):
        """pass@k (k = 1, 4, 16, 64 up to `samples`), entropy, distinct correct answers per prompt, lengths
        and truncation on every prompt of `split`, from `samples` responses each (sft.sample_evaluation)."""
        ks = tuple(k for k in sft.PASS_KS if k <= samples)
        return sft.sample_evaluation(self.model, self.task, split, ks=ks, samples=samples, generator=generator,
                                     temperature=self.temperature)

    def check(self, name="policy"):
        return self


class TransformerCritic:
    """PPO's critic for the transformer policy: a separate value model (as TRL's and verl's PPO use), a
    TinyLM of the policy's size with a scalar value head, its trunk initialized from the policy's weights
    and its head at zero. values[:, t] is the value of the state before completion token t; the state
    after the cap is the value at the last position (a value head shares its estimate across positions)."""

    description = "a separate TinyLM value model, trunk initialized from the policy, value head at zero"
    after_cap = "the value model's estimate at the last token (it shares across positions)"

    def __init__(self, policy):
        config = dataclasses.replace(policy.model.config, value_head=True)
        dtype = next(policy.model.parameters()).dtype
        self.model = TinyLM(config, generator=torch.Generator().manual_seed(0)).to(dtype)
        self.model.load_state_dict(policy.model.state_dict(), strict=False)
        self.policy = policy

    def parameters(self):
        return list(self.model.parameters())

    def values(self, prompts, completion_ids):
        """(N, R) V(s_t) before every completion token and (N,) V of the state after the cap, with gradient."""
        ids, mask = self.policy.prompt_batch(prompts)
        width, length = ids.shape[1], completion_ids.shape[1]
        sequences = torch.cat([ids, completion_ids], dim=1)
        attention = torch.cat([mask, torch.ones_like(completion_ids)], dim=1)
        values = self.model.values(sequences, attention, self.policy._position_ids(attention))  # (N, P + R)
        return values[:, width - 1: width - 1 + length], values[:, -1]


# ---------------------------------------------------------------------------------------------
# Building a run's policy from its settings
# ---------------------------------------------------------------------------------------------

DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def build_table(cfg, task, progress=None):
    """The all-zero table of the binary task (a uniform policy), float64."""
    return TablePolicy.uniform(task, cfg.max_new_tokens, cfg.temperature)


def build_transformer(cfg, task, progress=None):
    """The SFT warm start of the task (trained once, then loaded from cfg.sft_folder), in cfg.dtype."""
    model, _, _ = sft.load_or_train(task, sft_config_of(cfg), cfg.sft_folder, progress=progress)
    model = model.to(DTYPES[cfg.dtype])
    sampler_dtype = None if cfg.sampler_dtype is None else DTYPES[cfg.sampler_dtype]
    return TransformerPolicy(model, task, cfg.temperature, cfg.max_new_tokens, sampler_dtype, cfg.use_cache,
                             cfg.position_ids)


def sft_config_of(cfg, **fields):
    """The sft.SFTConfig of a transformer run's warm start: cfg.sft_steps steps seeded by cfg.sft_seed;
    `fields` set others (a runner's own start: discover-or-sharpen's subtraction share)."""
    return sft.SFTConfig(steps=cfg.sft_steps, seed=cfg.sft_seed, **fields)


def sft_cache_folder(cfg):
    """The folder a transformer run's SFT start is cached in (None for a table)."""
    if cfg.policy != "transformer":
        return None
    task = TASKS[cfg.task](cfg.max_new_tokens)
    return sft.cache_folder_of(task, sft_config_of(cfg), cfg.sft_folder)


SFT_FILES = (sft.MODEL_FILE, sft.CONFIG_FILE, sft.REPORT_FILE)
POLICIES = {"table": build_table, "transformer": build_transformer}
