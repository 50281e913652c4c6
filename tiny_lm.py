"""A tiny decoder-only transformer language model, the policy of the lab's language-model RL runs.

    python -m unittest -v test_tiny_lm       # masks, padding, the KV cache, precision, does it learn
    python bench.py                           # includes sampled tokens/s with and without the KV cache

    model = TinyLM(TinyLMConfig(vocab_size=32), generator=torch.Generator().manual_seed(0))
    out = generate(model, prompts, prompt_mask, 16, eos_id=1, pad_id=0, generator=torch.Generator().manual_seed(1))
    logp = completion_log_probs(model, out.sequences, out.attention_mask, out.completion_mask)

Read it like nanoGPT's model.py, top to bottom: the config, the one place the attention mask is built,
the blocks (attention, MLP), the model, then what RL needs around it: scoring completions (log-probs,
entropy, values, with the causal shift) and sampling them (temperature, top-p, a KV cache, a lower
precision).

Shape notation: N sequences, T positions (P prompt positions, R = max_new_tokens), V vocabulary,
D width (d_model), H heads, Dh = D / H per head. Masks are bool or 0/1 integer tensors, 1 = a real token.

Two masks, never to be confused (the lesson of left padding):
- the attention mask (N, T) says which tokens exist: a query never attends to a key whose mask is 0,
  and position ids count only real tokens (`position_ids_from_mask`);
- the completion (loss) mask (N, T) says which tokens are scored: the completion tokens up to and
  including the first EOS. Prompt tokens are real (attended to) but carry no loss.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from typing import NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from lab.checks import FLOAT_DTYPES, check_int, check_real, check_same_shape, check_tensor

# ---------------------------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class TinyLMConfig:
    """The model's size. JSON round trip: `TinyLMConfig(**json.loads(json.dumps(dataclasses.asdict(c))))`.

    The default (2 layers, width 48, 4 heads, 32 tokens, 64 positions) has 62,784 parameters, 62,833 with
    the value head: small enough to sample 64 x 16 tokens in tens of milliseconds on one CPU core.
    """

    vocab_size: int = 32
    n_layer: int = 2
    n_head: int = 4
    d_model: int = 48
    max_len: int = 64  # positions: a sequence (prompt + completion, padding included) is at most this long
    dropout: float = 0.0  # keep 0 for RL: dropout makes the sampler's and the trainer's log-probs differ
    mlp_ratio: int = 4  # the MLP's hidden width is mlp_ratio * d_model (4 in GPT-2)
    layer_norm_eps: float = 1e-5
    init_std: float = 0.02  # std of the normal initialization (GPT-2)
    value_head: bool = False  # add a (D -> 1) head for PPO's critic: see TinyLM.values

    def __post_init__(self):
        for name, low in (("vocab_size", 2), ("n_layer", 1), ("n_head", 1), ("d_model", 1), ("max_len", 1),
                          ("mlp_ratio", 1)):
            check_int(name, getattr(self, name), low=low, high=1_000_000)
        if self.d_model % self.n_head:
            raise ValueError(f"d_model: expected a multiple of n_head={self.n_head}, got {self.d_model}")
        check_real("dropout", self.dropout, low=0.0, high=1.0, high_open=True)
        check_real("layer_norm_eps", self.layer_norm_eps, low=0.0, low_open=True)
        check_real("init_std", self.init_std, low=0.0, low_open=True)
        if not isinstance(self.value_head, bool):
            raise ValueError(f"value_head: expected a bool, got {type(self.value_head).__name__}")


# ---------------------------------------------------------------------------------------------
# Masks and positions: the one place that decides what a token may see
# ---------------------------------------------------------------------------------------------


def _mask_int64(name, mask, ndim=2):
    check_tensor(name, mask, kind="mask", ndim=ndim)
    return mask.long()


def position_ids_from_mask(attention_mask):
    """(N, T) int64 position of each token among the real tokens of its row: cumsum(mask) - 1, clamped at 0.

    A left-padded sequence's first real token gets position 0, exactly as when it runs alone, so its
    log-probs do not depend on how much padding the batch added. Padding positions get the position of
    the last real token before them (0 before the first one); their value never matters because no
    real query attends to them.
    """
    return _position_ids(_mask_int64("attention_mask", attention_mask))


def _position_ids(attention_mask):
    return (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)  # int64: an int8 cumsum would wrap round


def causal_padding_mask(attention_mask, query_count):
    """(N, 1, Tq, Tk) bool, True where query i may attend to key j; broadcast over the H heads.

    attention_mask: (N, Tk) 0/1 over every key position (with a KV cache: the cached positions, then
    the new ones); the queries are the last `query_count` positions of those keys. Query i (at key
    position Tk - Tq + i) sees key j when
        j <= i's position          (causality: never a later token)
        and key j is real          (padding is invisible: a pad key gets probability exactly 0),
    or when j is i's own position. That last rule only matters for a padding query, whose keys can all
    be masked (a left pad, or a row of padding only): a softmax over no key is 0/0 = NaN. torch
    2.13's scaled_dot_product_attention returns 0 for such a row, a hand-written softmax does not;
    with every query seeing at least itself, no implementation of attention can produce NaN.
    A real query already sees itself, so real tokens are unaffected.
    """
    keys = attention_mask.shape[-1]
    key_positions = torch.arange(keys)  # (Tk,)
    query_positions = torch.arange(keys - query_count, keys)  # (Tq,)
    causal = key_positions[None, :] <= query_positions[:, None]  # (Tq, Tk)
    itself = key_positions[None, :] == query_positions[:, None]  # (Tq, Tk)
    real_key = attention_mask.bool()[:, None, None, :]  # (N, Tk) -> (N, 1, 1, Tk)
    return (causal & real_key) | itself  # (N, 1, Tq, Tk)


def attention_bias(mask, dtype):
    """The additive form of a bool attention mask, in `dtype`: 0 where a query may attend, -inf where not.

    scaled_dot_product_attention adds it to the scores q k^T / sqrt(Dh) before the softmax, as it does with
    the bool mask it converts itself (x + 0 is x, x - inf is -inf): the same bits. The sampler keeps one
    up to date instead of converting a bool mask in every layer at every step.
    """
    return torch.zeros(mask.shape, dtype=dtype).masked_fill_(~mask.bool(), -math.inf)


# ---------------------------------------------------------------------------------------------
# The blocks
# ---------------------------------------------------------------------------------------------


class KVCache:
    """The keys and values of the positions already run, per layer, so one sampling step runs only the
    new token instead of the whole sequence again.

    keys[layer], values[layer]: (N, H, capacity, Dh) buffers allocated once (uninitialized: positions
    [0, length) hold keys and values, the rest is never read). `TinyLM.forward(..., cache=cache)` writes
    the new positions after `length` in every layer, then advances `length`.
    """

    def __init__(self, config, batch_size, capacity, dtype):
        head_dim = config.d_model // config.n_head
        shape = (batch_size, config.n_head, capacity, head_dim)
        self.keys = [torch.empty(shape, dtype=dtype) for _ in range(config.n_layer)]
        self.values = [torch.empty(shape, dtype=dtype) for _ in range(config.n_layer)]
        self.length = 0

    def extend(self, layer, k, v):
        """Store the new (N, H, Tq, Dh) keys and values of `layer`; return all of them, (N, H, length + Tq, Dh)."""
        end = self.length + k.shape[2]
        self.keys[layer][:, :, self.length:end] = k
        self.values[layer][:, :, self.length:end] = v
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]

    def select_rows(self, rows):
        """Keep the cached rows `rows` ((N',) int64, repeats allowed): a prompt run once serves every
        response drawn from it (a group of G), with the same keys and values bit for bit."""
        # index_select copies whole rows, several times faster than the general indexing of keys[rows]
        self.keys = [keys.index_select(0, rows) for keys in self.keys]  # (N, H, capacity, Dh) -> (N', H, capacity, Dh)
        self.values = [values.index_select(0, rows) for values in self.values]


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.n_head = config.n_head
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)  # queries, keys and values of all heads at once
        self.proj = nn.Linear(config.d_model, config.d_model)
        self.dropout = config.dropout  # on the attention weights and the output, while training only

    def forward(self, x, mask, cache=None, layer=0):
        """x (N, Tq, D), mask (N, 1, Tq, Tk) from `causal_padding_mask` -> (N, Tq, D)."""
        batch, length, width = x.shape
        qkv = self.qkv(x).view(batch, length, 3, self.n_head, -1)  # (N, Tq, 3D) -> (N, Tq, 3, H, Dh)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # (N, Tq, 3, H, Dh) -> 3 x (N, H, Tq, Dh), views
        if cache is not None:
            k, v = cache.extend(layer, k, v)  # (N, H, Tk, Dh), Tk = cached + Tq
        dropout = self.dropout if self.training else 0.0
        # softmax(q k^T / sqrt(Dh)) v with False entries of the mask at probability 0
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout)  # (N, H, Tq, Dh)
        y = self.proj(y.transpose(1, 2).reshape(batch, length, width))  # (N, H, Tq, Dh) -> (N, Tq, D)
        return F.dropout(y, dropout) if dropout else y  # a call less per layer when sampling

    def step(self, x, bias, cache, layer):
        """`forward` for one new token per row, while sampling: x (N, D), bias (N, 1, 1, Tk) from
        `attention_bias` -> (N, D). The same kernels on the same memory as forward(x[:, None], ...)[:, 0],
        with fewer reshapes."""
        batch, width = x.shape
        q, k, v = self.qkv(x).view(batch, 3, self.n_head, 1, -1).unbind(1)  # (N, 3D) -> 3 x (N, H, 1, Dh), views
        k, v = cache.extend(layer, k, v)  # (N, H, Tk, Dh)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)  # (N, H, 1, Dh)
        return self.proj(y.view(batch, width))  # (N, H, 1, Dh) -> (N, D)


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.fc = nn.Linear(config.d_model, config.mlp_ratio * config.d_model)
        self.proj = nn.Linear(config.mlp_ratio * config.d_model, config.d_model)
        self.dropout = config.dropout

    def forward(self, x):
        y = self.proj(F.gelu(self.fc(x)))  # GELU with erf, as nn.GELU()
        return F.dropout(y, self.dropout) if self.training and self.dropout else y


class Block(nn.Module):
    """Pre-LayerNorm residual block (GPT-2): x + attention(LN(x)), then + MLP(LN(x))."""

    def __init__(self, config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x, mask, cache=None, layer=0):
        x = x + self.attn(self.ln_1(x), mask, cache, layer)
        return x + self.mlp(self.ln_2(x))

    def step(self, x, bias, cache, layer):
        """`forward` for one new token per row (N, D), without dropout: see CausalSelfAttention.step."""
        x = x + self.attn.step(self.ln_1(x), bias, cache, layer)
        return x + self.mlp(self.ln_2(x))


# ---------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------


class TinyLM(nn.Module):
    """A GPT-2-style decoder-only transformer: token + position embeddings, pre-LN blocks, a final
    LayerNorm, an LM head (and, with `config.value_head`, a value head for PPO).

    Positions are learned absolute embeddings (GPT-2), not rotary. Two reasons. They are the simplest
    thing that works at this size. And they make the padding lesson visible: with rotary embeddings an
    attention score depends only on the distance between two tokens, so giving a left-padded row
    positions 0..T-1 instead of counting from its first real token would shift every position by the
    same amount and change nothing; with absolute positions it changes every log-prob (the bug
    `position_ids_from_mask` prevents, measured in test_tiny_lm).

    The LM head is not tied to the token embedding (GPT-2 ties them): with tying, the padding token's
    embedding would also be its output row and receive gradient through every softmax, and "padding
    gets no gradient" could no longer be checked exactly. The cost is V x D parameters (1,536 here).

    Weights are drawn from `generator` (a torch.Generator; None: torch's global generator): the
    GPT-2 initialization, normal(0, init_std), residual projections scaled by 1/sqrt(2 n_layer),
    biases 0, the value head 0 (every value starts at 0, a neutral baseline). Building the layers
    leaves the global generator untouched.
    """

    def __init__(self, config, generator=None):
        super().__init__()
        if not isinstance(config, TinyLMConfig):
            raise ValueError(f"config: expected a TinyLMConfig, got {type(config).__name__}")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise ValueError(f"generator: expected a torch.Generator or None, got {type(generator).__name__}")
        self.config = config
        with torch.random.fork_rng(devices=[]):  # the layers' own default init is overwritten below
            self.token_embedding = nn.Embedding(config.vocab_size, config.d_model)
            self.position_embedding = nn.Embedding(config.max_len, config.d_model)
            self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
            self.ln_f = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
            self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
            self.value_head = nn.Linear(config.d_model, 1) if config.value_head else None
        self._init_weights(generator)

    @torch.no_grad()
    def _init_weights(self, generator):
        std = self.config.init_std
        for name, parameter in self.named_parameters():
            if name.endswith("bias") or name.startswith("value_head"):
                parameter.zero_()
            elif "ln_" in name:
                parameter.fill_(1.0)  # LayerNorm gains start at 1
            else:
                # GPT-2: the projections that add into the residual stream are scaled down with depth
                scale = 1 / math.sqrt(2 * self.config.n_layer) if name.endswith("proj.weight") else 1.0
                nn.init.normal_(parameter, 0.0, std * scale, generator=generator)

    def num_parameters(self):
        """Number of scalar parameters (the value head included when there is one)."""
        return sum(parameter.numel() for parameter in self.parameters())

    def hidden_states(self, input_ids, attention_mask=None, position_ids=None, *, cache=None, check=True):
        """(N, Tq, D) final-LayerNorm hidden states, the input of the LM head and of the value head.

        input_ids: (N, Tq) int token ids in [0, V). Without a cache, Tq = T (the whole sequence).
        attention_mask: (N, Tk) 0/1, 1 = real token; None = all real. With a cache it covers the cached
            positions and then the Tq new ones (Tk = cache.length + Tq), otherwise Tk = Tq.
        position_ids: (N, Tq) int in [0, max_len); None = `position_ids_from_mask(attention_mask)`,
            its last Tq columns.
        cache: a `KVCache` (used by `generate`): the new keys and values are stored and `cache.length`
            advances by Tq.
        check: validate the arguments (`generate` validates once and then skips it).
        Masking: see `causal_padding_mask`. Outputs at padding positions are finite but meaningless.
        Raises ValueError naming the argument: bad dtype/shape, ids outside [0, V), positions outside
        [0, max_len), a cache that is full.
        """
        if check:
            self._check_inputs(input_ids, attention_mask, position_ids, cache)
        batch, length = input_ids.shape
        past = 0 if cache is None else cache.length
        if attention_mask is None:
            attention_mask = torch.ones(batch, past + length, dtype=torch.long)
        if position_ids is None:
            position_ids = _position_ids(attention_mask)[:, past:]  # (N, Tk) -> (N, Tq); checked above
        return self._trunk(input_ids, position_ids, causal_padding_mask(attention_mask, length), cache)

    def _trunk(self, input_ids, position_ids, mask, cache=None):
        """(N, Tq, D) hidden states from checked (N, Tq) ids and positions and the (N, 1, Tq, Tk) attention mask."""
        x = self.token_embedding(input_ids.long()) + self.position_embedding(position_ids.long())  # (N, Tq, D)
        if self.training and self.config.dropout:
            x = F.dropout(x, self.config.dropout)
        for layer, block in enumerate(self.blocks):
            x = block(x, mask, cache, layer)
        if cache is not None:
            cache.length += input_ids.shape[1]
        return self.ln_f(x)

    def _step_logits(self, tokens, positions, bias, cache):
        """(N, V) next-token logits after one new token per row, while sampling with a cache (eval mode):
        tokens, positions (N,) int64, bias (N, 1, 1, cache.length + 1) from `attention_bias`. The bits of
        self(...)[:, -1] on the same keys."""
        x = self.token_embedding(tokens) + self.position_embedding(positions)  # (N, D)
        for layer, block in enumerate(self.blocks):
            x = block.step(x, bias, cache, layer)
        cache.length += 1
        return self.lm_head(self.ln_f(x))  # (N, D) -> (N, V)

    def _check_inputs(self, input_ids, attention_mask, position_ids, cache):
        check_tensor("input_ids", input_ids, kind="int", ndim=2)
        batch, length = input_ids.shape
        vocab = self.config.vocab_size
        if bool(((input_ids.long() < 0) | (input_ids.long() >= vocab)).any()):
            raise ValueError(f"input_ids: expected token ids in [0, {vocab}), got values outside")
        past = 0 if cache is None else cache.length
        if attention_mask is not None:
            check_tensor("attention_mask", attention_mask, kind="mask", ndim=2)
        if attention_mask is not None and attention_mask.shape != (batch, past + length):
            raise ValueError(f"attention_mask: expected shape {(batch, past + length)} (cached + new positions), "
                             f"got {tuple(attention_mask.shape)}")
        if position_ids is not None:
            check_tensor("position_ids", position_ids, kind="int", ndim=2)
            check_same_shape([("input_ids", input_ids), ("position_ids", position_ids)])
            positions = position_ids.long()
        else:
            positions = torch.tensor([past + length - 1])  # the largest position cumsum - 1 can reach
        if bool(((positions < 0) | (positions >= self.config.max_len)).any()):
            raise ValueError(f"position_ids: expected positions in [0, {self.config.max_len}) (max_len), "
                             f"got {int(positions.min())}..{int(positions.max())}")
        if cache is not None and past + length > cache.keys[0].shape[2]:
            raise ValueError(f"cache: holds {cache.keys[0].shape[2]} positions, {past + length} needed")

    def forward(self, input_ids, attention_mask=None, position_ids=None, *, cache=None, check=True):
        """(N, Tq, V) next-token logits: row t scores token t+1. Arguments as `hidden_states`."""
        return self.lm_head(self.hidden_states(input_ids, attention_mask, position_ids, cache=cache, check=check))

    def values(self, input_ids, attention_mask=None, position_ids=None, *, check=True):
        """(N, T) value of each prefix: values[:, t] estimates the return after tokens 0..t, i.e. the value
        of the state in which token t+1 is chosen. Needs `config.value_head`; arguments as `hidden_states`.

        Both critics PPO uses on language models are this one class. The separate critic is the
        default to build: a second TinyLM with value_head=True (its LM head unused), initialized from
        the SFT policy and trained with its own optimizer, as TRL's PPOTrainer (value_model) and verl
        (critic) do; the value loss then cannot move the policy's features, and the policy's clipping
        cannot hold the critic back:

            critic = TinyLM(dataclasses.replace(policy.config, value_head=True))
            critic.load_state_dict(policy.state_dict(), strict=False)  # every weight but the value head

        The shared trunk (one TinyLM with the value head, loss = policy loss + vf_coef * value loss,
        `logits_and_values` for one pass) is the original RLHF recipe and TRL's older
        AutoModelForCausalLMWithValueHead: half the compute, coupled losses.
        Raises ValueError when the model has no value head.
        """
        return self.logits_and_values(input_ids, attention_mask, position_ids, check=check)[1]

    def logits_and_values(self, input_ids, attention_mask=None, position_ids=None, *, check=True):
        """((N, T, V) logits, (N, T) values) from one pass through the trunk (the shared-trunk critic)."""
        if self.value_head is None:
            raise ValueError("model: has no value head (build it with TinyLMConfig(value_head=True))")
        hidden = self.hidden_states(input_ids, attention_mask, position_ids, check=check)  # (N, T, D)
        return self.lm_head(hidden), self.value_head(hidden).squeeze(-1)  # (N, T, 1) -> (N, T)


# ---------------------------------------------------------------------------------------------
# Scoring completions: the causal shift, temperature, entropy, values
# ---------------------------------------------------------------------------------------------


class LogitsOverflow(FloatingPointError):
    """A forward pass gave NaN or inf logits: the weights or activations exceed the range of the dtype
    it ran in (float16 stops at 65504), or the weights are no longer finite (training diverged).
    A FloatingPointError, so a training loop reports it as a diverged run."""


def _check_model(model):
    if not isinstance(model, TinyLM):
        raise ValueError(f"model: expected a TinyLM, got {type(model).__name__}")


def _check_scoring_model(model):
    """A model to score with: a TinyLM, or any nn.Module called as model(input_ids, attention_mask,
    position_ids) that returns (N, T, V) logits (a test's stand-in with fixed logits)."""
    if not isinstance(model, nn.Module):
        raise ValueError(f"model: expected a TinyLM (or an nn.Module returning (N, T, V) logits), "
                         f"got {type(model).__name__}")


def _check_model_logits(logits, input_ids):
    if not (isinstance(logits, torch.Tensor) and logits.is_floating_point() and logits.dim() == 3
            and logits.shape[:2] == input_ids.shape):
        got = (f"shape {tuple(logits.shape)}, {logits.dtype}" if isinstance(logits, torch.Tensor)
               else type(logits).__name__)
        raise ValueError(f"model: expected floating (N, T, V) logits for input_ids of shape {tuple(input_ids.shape)}, "
                         f"got {got}")


def _check_logits(name, logits):
    """Raise LogitsOverflow, naming `name` and the dtype of the logits, unless every logit is finite."""
    if not bool(torch.isfinite(logits).all()):
        dtype = str(logits.dtype).replace("torch.", "")
        raise LogitsOverflow(f"{name}: the forward pass in {dtype} gives NaN or inf logits (weights or activations "
                             f"beyond the range of {dtype}, or weights that are not finite)")


def tempered_log_probs(logits, temperature=1.0, top_p=1.0):
    """(..., V) log-probs of the distribution a sampler draws from: softmax(logits / temperature),
    then top-p (nucleus) sampling (Holtzman et al. 2020, section 3.1): keep the smallest set of most
    likely tokens whose probability mass reaches top_p (the token that crosses it included), set the
    others to -inf, renormalize. top_p = 1 keeps every token.

    The same transformation serves the sampler (`generate`) and a trainer that scores with tempered
    logits, so both compute the same numbers from the same logits.
    logits: (..., V) finite floating tensor; temperature > 0; top_p in (0, 1].
    Raises ValueError naming the argument, and naming temperature when logits / temperature overflows
    the logits' dtype (a temperature so small that a log-prob would be NaN or -inf: 1e-40 in float32).
    """
    check_tensor("logits", logits)
    if logits.dim() < 1:
        raise ValueError("logits: expected at least 1 dimension (the vocabulary), got a 0-d tensor")
    check_real("temperature", temperature, low=0.0, low_open=True)
    check_real("top_p", top_p, low=0.0, high=1.0, low_open=True)
    return _tempered_log_probs(logits, temperature, top_p)


def _tempered_log_probs(logits, temperature, top_p):
    """tempered_log_probs on checked arguments and finite logits; still refuses an overflowing temperature."""
    logp = torch.log_softmax(logits if temperature == 1.0 else logits / temperature, dim=-1)  # (..., V); x / 1 is x
    # finite logits divided by a tiny temperature can exceed the dtype: inf - inf = NaN, or a -inf
    # log-prob whose 0 * -inf makes the entropy NaN
    if not bool(torch.isfinite(logp).all()):
        dtype = str(logits.dtype).replace("torch.", "")
        raise ValueError(f"temperature: {temperature} is too small for {dtype} logits (logits / temperature "
                         "overflows: NaN or infinite log-probs)")
    if top_p >= 1.0:
        return logp
    sorted_logp, order = logp.sort(dim=-1, descending=True)  # (..., V), most likely first
    sorted_probs = sorted_logp.exp()
    before = sorted_probs.cumsum(dim=-1) - sorted_probs  # mass of the tokens ranked above each one
    kept = before < top_p  # (..., V) in rank order
    kept[..., 0] = True  # the most likely token always: a top_p below the dtype's smallest number reads as 0
    keep = torch.zeros_like(before, dtype=torch.bool).scatter(-1, order, kept)  # back to vocab order
    return torch.log_softmax(logp.masked_fill(~keep, -math.inf), dim=-1)


class CompletionScores(NamedTuple):
    """What one forward pass gives the RL update, all (N, T-1) (or (N, T-1, V)) after the causal shift:
    column t is about token t+1, predicted from tokens 0..t."""

    log_probs: torch.Tensor  # (N, T-1) log-prob of token t+1; 0 where completion_mask[:, 1:] is 0
    entropy: torch.Tensor  # (N, T-1) nats, entropy of the distribution token t+1 was drawn from; 0 outside the mask
    log_softmax: torch.Tensor  # (N, T-1, V) every token's log-prob at each position, not masked
    values: torch.Tensor | None  # (N, T-1) value of the state before token t+1; 0 outside the mask; None unless asked


def completion_scores(model, input_ids, attention_mask, completion_mask, *, temperature=1.0, position_ids=None,
                      with_values=False):
    """Log-probs, entropy and (optionally) values of the completion tokens, with gradient, in one forward pass.

    Args:
        model: a TinyLM (in the dtype to score in), or any nn.Module called as
            model(input_ids, attention_mask, position_ids) that returns (N, T, V) logits.
        input_ids: (N, T) int, prompt + completion (+ padding), T >= 2.
        attention_mask: (N, T) 0/1, 1 = real token (prompt or completion), 0 = padding; decides what
            is attended to and the position ids.
        completion_mask: (N, T) 0/1, 1 = a token that is scored (completion tokens up to and including
            the first EOS); must be 0 where attention_mask is 0. Decides what carries loss, nothing else.
        temperature: > 0, the logits are divided by it (score with the temperature the sampler used).
        position_ids: (N, T) or None (= position_ids_from_mask(attention_mask)).
        with_values: also return the value head's values (shared-trunk critic); needs config.value_head.
    Returns:
        CompletionScores: log_probs, entropy, values (N, T-1), masked entries exactly 0 through
        torch.where, so gradient flows only through kept entries (a pad or prompt token gets no loss,
        and padding gets no gradient at all); log_softmax (N, T-1, V) unmasked.
    Raises:
        ValueError naming the argument: a model that is not an nn.Module or returns no (N, T, V)
        logits, shapes, dtypes, T < 2, a completion token that is padding, temperature <= 0 or so
        small that logits / temperature overflows, with_values without a TinyLM with a value head.
        LogitsOverflow (a FloatingPointError) naming model and its dtype when the forward pass gives
        NaN or inf logits.
    """
    _check_scoring_model(model)
    check_tensor("input_ids", input_ids, kind="int", ndim=2)
    attention = _mask_int64("attention_mask", attention_mask)
    completion = _mask_int64("completion_mask", completion_mask)
    check_same_shape([("input_ids", input_ids), ("attention_mask", attention_mask),
                      ("completion_mask", completion_mask)])
    if input_ids.shape[1] < 2:
        raise ValueError(f"input_ids: expected at least 2 positions for the causal shift, got {input_ids.shape[1]}")
    if bool((completion > attention).any()):
        raise ValueError("completion_mask: a completion token must be real (attention_mask 1 there)")
    check_real("temperature", temperature, low=0.0, low_open=True)
    if with_values:
        if not isinstance(model, TinyLM):
            raise ValueError(f"model: with_values needs a TinyLM with a value head, got {type(model).__name__}")
        logits, values = model.logits_and_values(input_ids, attention, position_ids)  # (N, T, V), (N, T)
    else:
        logits, values = model(input_ids, attention, position_ids), None  # (N, T, V)
    _check_model_logits(logits, input_ids)
    _check_logits("model", logits)
    log_softmax = _tempered_log_probs(logits[:, :-1], temperature, 1.0)  # (N, T-1, V): row t scores token t+1
    scored = completion[:, 1:].bool()  # (N, T-1); position 0 is never predicted
    targets = input_ids[:, 1:].long().unsqueeze(-1)  # (N, T-1) -> (N, T-1, 1)
    log_probs = log_softmax.gather(-1, targets).squeeze(-1)  # (N, T-1, 1) -> (N, T-1)
    entropy = -(log_softmax.exp() * log_softmax).sum(dim=-1)  # (N, T-1, V) -> (N, T-1)
    zero = torch.zeros_like(log_probs)
    # where(), not multiplication: a masked entry is exactly 0 and passes no gradient (not even 0 * NaN)
    return CompletionScores(
        log_probs=torch.where(scored, log_probs, zero),
        entropy=torch.where(scored, entropy, zero),
        log_softmax=log_softmax,
        values=None if values is None else torch.where(scored, values[:, :-1], zero),
    )


def completion_log_probs(model, input_ids, attention_mask, completion_mask, *, temperature=1.0, position_ids=None):
    """(N, T-1) log-prob of token t+1 given tokens <= t, 0 where completion_mask[:, 1:] is 0.

    Gradient flows only through kept entries. Arguments and errors as `completion_scores`; the same
    numbers as rl_lab.response_token_logps on the model's logits.
    """
    return completion_scores(model, input_ids, attention_mask, completion_mask, temperature=temperature,
                             position_ids=position_ids).log_probs


def shared_prompt_logits(model, input_ids, attention_mask, prompt_length, position_ids=None):
    """(N, R, V) the logits that predict the last R = T - prompt_length tokens, computed once per distinct
    prompt: model(input_ids, attention_mask, position_ids)[:, prompt_length - 1:-1], bit for bit.

    Rows that share their first prompt_length tokens (the G responses of a group, the solutions of one
    prompt) share the keys and values of those positions, so the prompt runs once per distinct prompt
    (a first pass over full rows, one per prompt) and every row then runs only its last R tokens against
    them (a second pass with a KV cache). Each token is computed by the same kernels on key sets of the
    same length T as in one pass over every row, hence the same bits (test_tiny_lm checks it); a first
    pass over prompt_length positions only would attend over fewer keys and differ in the last bits.

    With gradient enabled the logits carry it (the update of a group of G responses runs its prompt once,
    not G times: ~25% less time for a batch of the online loop): the gradient that reaches a shared prompt's
    keys and values is the sum over the rows that share it, so parameter gradients equal a full pass's up to
    the order of that sum (relative ~1e-6, test_tiny_lm). Without gradient it runs in inference mode.

    input_ids, attention_mask, position_ids: as `TinyLM.hidden_states` (no cache), (N, T).
    prompt_length: P in [1, T), the width of the (left-padded) prompts.
    """
    _check_model(model)
    check_int("prompt_length", prompt_length, low=1, high=input_ids.shape[1] - 1)
    model._check_inputs(input_ids, attention_mask, position_ids, None)
    if torch.is_grad_enabled():
        return _shared_prompt_logits(model, input_ids, attention_mask, prompt_length, position_ids)
    with torch.inference_mode():  # no autograd bookkeeping on the tensors of the two passes
        logits = _shared_prompt_logits(model, input_ids, attention_mask, prompt_length, position_ids)
    return logits.clone()  # a copy outside inference_mode: the caller may write into it or keep it for a backward pass


def distinct_rows(keys):
    """torch.unique(keys, dim=0, return_inverse=True) for (N, K) int64 keys whose repeats mostly come in
    runs (a group's G responses, a prompt's solutions): ((U, K) the distinct rows in sorted order, (N,)
    int64 the index of each row's). Equal consecutive rows are merged first, so the row-by-row sort of
    torch.unique(dim=0) runs on one row a run; the result is the same."""
    starts = torch.ones(keys.shape[0], dtype=torch.bool)
    starts[1:] = (keys[1:] != keys[:-1]).any(dim=1)  # (N,): a row that differs from the one before it
    distinct, of_run = torch.unique(keys[starts], dim=0, return_inverse=True)  # (runs, K) -> (U, K), (runs,)
    return distinct, of_run[starts.cumsum(0) - 1]  # (N,): the run of each row -> its distinct row


def _shared_prompt_logits(model, input_ids, attention_mask, prompt_length, position_ids):
    batch, total = input_ids.shape
    attention = torch.ones_like(input_ids) if attention_mask is None else attention_mask
    positions = _position_ids(attention) if position_ids is None else position_ids
    prompt = slice(0, prompt_length)
    keys = torch.cat([input_ids[:, prompt], attention[:, prompt], positions[:, prompt]], dim=1).long()  # (N, 3P)
    _, rows = distinct_rows(keys)  # (N,): the distinct prompt of each row
    count = int(rows.max()) + 1
    first = torch.full((count,), batch).scatter_reduce_(0, rows, torch.arange(batch), "amin")  # (U,) a row each
    cache = KVCache(model.config, count, total, next(model.parameters()).dtype)
    hidden = model._trunk(input_ids[first], positions[first], causal_padding_mask(attention[first], total), cache)
    at_prompt_end = model.lm_head(hidden[:, prompt_length - 1])[rows]  # (U, D) -> (U, V) -> (N, V)
    cache.select_rows(rows)
    cache.length = prompt_length  # the representatives' own last R positions are overwritten below
    rest = slice(prompt_length, total)
    hidden = model._trunk(input_ids[:, rest], positions[:, rest], causal_padding_mask(attention, total - prompt_length),
                          cache)  # (N, R, D)
    # contiguous: matmul folds a strided (N, R-1, D) into one mm only when the head's weight requires grad, and
    # uses bmm otherwise; the two round differently on some CPUs, and a frozen snapshot's old_logps must equal
    # the trainer's logps bit for bit (the ratio is exactly 1 before the first update)
    return torch.cat([at_prompt_end.unsqueeze(1), model.lm_head(hidden[:, :-1].contiguous())], dim=1)  # (N, R, V)


# ---------------------------------------------------------------------------------------------
# Sampling: left-padded prompts, temperature, top-p, a KV cache, a lower precision
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Generation:
    """What `generate` returns. T = P + max_new_tokens; masks are int64 0/1."""

    sequences: torch.Tensor  # (N, T) int64: the left-padded prompt, the completion, then pad_id after the first EOS
    attention_mask: torch.Tensor  # (N, T): 1 on real tokens (the prompt's, the completion's up to its first EOS)
    completion_mask: torch.Tensor  # (N, T): 1 on completion tokens up to and including the first EOS
    log_probs: torch.Tensor  # (N, max_new_tokens) the sampler's log-prob of each sampled token, 0 past the end
    truncated: torch.Tensor  # (N,) bool: no EOS within max_new_tokens


def sample_tokens(log_probs, uniforms):
    """(N,) int64 tokens drawn from (N, V) log-probs by the inverse CDF with one uniform in [0, 1) per row.

    Token k is drawn when the threshold (1 - u) * total mass falls in (cdf[k-1], cdf[k]], so a token of
    probability 0 (outside the top-p set) is never drawn. One uniform per row and step, however the
    logits were computed, is what makes the cached and the uncached sampler draw the same tokens.
    """
    cdf = log_probs.exp().cumsum(dim=-1)  # (N, V)
    threshold = (1.0 - uniforms) * cdf[:, -1]  # (N,), in (0, total]
    return (cdf < threshold.unsqueeze(-1)).sum(dim=-1)  # (N, V) -> (N,): the tokens whose cdf is below it


def _check_generate_args(model, input_ids, attention_mask, max_new_tokens, eos_id, pad_id, temperature, top_p,
                         generator, use_cache, dtype):
    _check_model(model)
    vocab, max_len = model.config.vocab_size, model.config.max_len
    check_tensor("input_ids", input_ids, kind="int", ndim=2)
    if bool(((input_ids.long() < 0) | (input_ids.long() >= vocab)).any()):
        raise ValueError(f"input_ids: expected token ids in [0, {vocab}), got values outside")
    mask = _mask_int64("attention_mask", attention_mask)
    check_same_shape([("input_ids", input_ids), ("attention_mask", attention_mask)])
    if bool((mask[:, 1:] < mask[:, :-1]).any()):
        raise ValueError("attention_mask: expected left-padded prompts (0s, then 1s, in every row)")
    check_int("max_new_tokens", max_new_tokens, low=1, high=max_len)
    if input_ids.shape[1] + max_new_tokens > max_len:
        raise ValueError(f"max_new_tokens: prompt width {input_ids.shape[1]} + {max_new_tokens} new tokens "
                         f"exceeds max_len={max_len}")
    check_int("eos_id", eos_id, low=0, high=vocab - 1)
    check_int("pad_id", pad_id, low=0, high=vocab - 1)
    check_real("temperature", temperature, low=0.0, low_open=True)
    check_real("top_p", top_p, low=0.0, high=1.0, low_open=True)
    if generator is not None and not isinstance(generator, torch.Generator):
        raise ValueError(f"generator: expected a torch.Generator or None, got {type(generator).__name__}")
    if not isinstance(use_cache, bool):
        raise ValueError(f"use_cache: expected a bool, got {type(use_cache).__name__}")
    if dtype is not None and dtype not in FLOAT_DTYPES:
        raise ValueError(f"dtype: expected None or one of float16, bfloat16, float32, float64, got {dtype!r}")
    return mask


@torch.no_grad()
def generate(model, input_ids, attention_mask, max_new_tokens, *, eos_id, pad_id, temperature=1.0, top_p=1.0,
             generator=None, use_cache=True, dtype=None):
    """Sample one completion per left-padded prompt, token by token. No gradient.

    Args:
        model: a TinyLM; it is left unchanged (its train/eval mode restored, dropout off while sampling).
        input_ids: (N, P) int prompts, left-padded (padding first); a row of padding only is allowed.
        attention_mask: (N, P) 0/1, 1 = real prompt token; each row 0s then 1s.
        max_new_tokens: R >= 1, with P + R <= config.max_len.
        eos_id, pad_id: token ids in [0, V) (they may be equal: positions decide, never ids).
        temperature: > 0; top_p: in (0, 1]. See `tempered_log_probs`.
        generator: the torch.Generator every draw comes from (None: torch's global one). Exactly one
            uniform per row per step is drawn, finished rows included, until every row has ended.
        use_cache: run each step on the new token only, with a `KVCache` (True), or on the whole
            sequence so far (False). Same generator state -> same samples either way.
        dtype: None (the model's parameter dtype) or e.g. torch.bfloat16 / torch.float16: the forward
            passes run on a copy of the weights cast to it, as an inference engine samples in a lower
            precision than the trainer scores in. The sampling distribution and `log_probs` are
            computed from those logits in the model's parameter dtype.
    Returns:
        Generation(sequences, attention_mask, completion_mask, log_probs, truncated): see its fields.
        Completion positions after the first EOS hold pad_id with both masks 0 and log_probs 0.
    Raises:
        ValueError naming the argument: a model that is not a TinyLM, bad shapes or dtypes, ids outside
        [0, V), prompts not left-padded, P + R > max_len, temperature <= 0 or so small that
        logits / temperature overflows, top_p outside (0, 1].
        LogitsOverflow (a FloatingPointError) naming dtype and its value (model, when sampling in the
        model's own dtype) when a forward pass gives NaN or inf logits, e.g. float16 sampling of
        weights too large for it: never NaN log_probs and token 0 drawn everywhere.
    """
    prompt_mask = _check_generate_args(model, input_ids, attention_mask, max_new_tokens, eos_id, pad_id,
                                       temperature, top_p, generator, use_cache, dtype)
    param_dtype = next(model.parameters()).dtype
    sampler = model if dtype is None or dtype == param_dtype else copy.deepcopy(model).to(dtype)
    was_training = model.training
    sampler.eval()  # dropout would make the sampler's log-probs differ from any later scoring
    try:
        with torch.inference_mode():  # no autograd bookkeeping on the many small tensors of each step
            out = _sample(sampler, input_ids, prompt_mask, max_new_tokens, eos_id, pad_id, temperature, top_p,
                          generator, use_cache, param_dtype)
    finally:
        model.train(was_training)
    # copies outside inference mode: the caller may write into them or keep them for a backward pass
    return Generation(**{field.name: getattr(out, field.name).clone() for field in dataclasses.fields(out)})


def _sample(sampler, input_ids, prompt_mask, max_new_tokens, eos_id, pad_id, temperature, top_p, generator,
            use_cache, out_dtype):
    batch, prompt_length = input_ids.shape
    total = prompt_length + max_new_tokens
    sequences = torch.full((batch, total), pad_id, dtype=torch.long)
    sequences[:, :prompt_length] = input_ids.long()
    mask = torch.zeros(batch, total, dtype=torch.long)
    mask[:, :prompt_length] = prompt_mask
    log_probs = torch.zeros(batch, max_new_tokens, dtype=out_dtype)
    finished = torch.zeros(batch, dtype=torch.bool)
    sampler_dtype = next(sampler.parameters()).dtype
    blamed = "model" if sampler_dtype == out_dtype else "dtype"  # the weights themselves, or their cast copy
    if use_cache:
        steps = _cached_steps(sampler, sequences, mask, prompt_length, sampler_dtype)
    else:  # the whole sequence so far at every step
        steps = (sampler(sequences[:, :end], mask[:, :end], check=False)[:, -1]
                 for end in range(prompt_length, total))  # (N, end, V) -> (N, V)
    for step, logits in enumerate(steps):  # logits (N, V) of the token at `end`
        end = prompt_length + step
        try:
            step_log_probs = _tempered_log_probs(logits.to(out_dtype), temperature, top_p)  # (N, V)
        except ValueError:  # NaN logits would draw token 0 everywhere: say whose they are
            _check_logits(blamed, logits)
            raise
        uniforms = torch.rand(batch, generator=generator, dtype=out_dtype)  # (N,)
        tokens = sample_tokens(step_log_probs, uniforms)  # (N,)
        token_log_probs = step_log_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)  # (N, 1) -> (N,)
        sequences[:, end] = tokens.masked_fill_(finished, pad_id)
        log_probs[:, step] = token_log_probs.masked_fill_(finished, 0.0)
        mask[:, end] = ~finished
        finished |= tokens == eos_id
        if bool(finished.all()):
            break  # the remaining columns are already pad_id, masks 0, log_probs 0
    completion_mask = mask.clone()
    completion_mask[:, :prompt_length] = 0
    return Generation(sequences=sequences, attention_mask=mask, completion_mask=completion_mask,
                      log_probs=log_probs, truncated=~finished)


def _cached_steps(sampler, sequences, mask, prompt_length, dtype):
    """The (N, V) next-token logits of each sampling step with a KV cache, as a generator: the prompt
    first, then only the token sampled last, which `_sample` writes into `sequences` and `mask` between
    two steps. The same numbers as a full forward pass on the sequence so far: the same kernels on the
    same shapes, the masks and positions kept up to date instead of rebuilt.

    A prompt that several rows share (a group of G responses) runs once: its keys and values are copied
    to every row that has it.
    """
    batch, total = sequences.shape
    prompts, rows = distinct_rows(torch.cat([sequences[:, :prompt_length], mask[:, :prompt_length]], dim=1))
    # (U, 2P) distinct prompts, (N,) the one of each row
    cache = KVCache(sampler.config, prompts.shape[0], total, dtype)
    hidden = sampler.hidden_states(prompts[:, :prompt_length], prompts[:, prompt_length:], cache=cache, check=False)
    yield sampler.lm_head(hidden[:, -1])[rows]  # (U, P, D) -> (U, V) -> (N, V)
    cache.select_rows(rows)
    # one query at `end - 1`: it sees the real keys before it and itself (`causal_padding_mask` with Tq = 1)
    bias = attention_bias(torch.ones(batch, 1, 1, total, dtype=torch.bool), dtype)  # (N, 1, 1, T), all 0
    bias[:, 0, 0, :prompt_length].masked_fill_(mask[:, :prompt_length] == 0, -math.inf)
    real_tokens = mask[:, :prompt_length].sum(dim=1)  # (N,)
    for end in range(prompt_length + 1, total):
        real_tokens += mask[:, end - 1]
        positions = (real_tokens - 1).clamp_(min=0)  # (N,): cumsum(mask) - 1 at the new token
        yield sampler._step_logits(sequences[:, end - 1], positions, bias[..., :end], cache)  # (N, V)
        bias[:, 0, 0, end - 1].masked_fill_(mask[:, end - 1] == 0, -math.inf)  # later queries see it only if real
