"""Two-step chain PPO with GAE: the first step never earns a reward, yet it must learn to pick the path.

    python ppo_chain.py                    # seed 7, lambda 0.95 -> results-chain/ppo-chain.{csv,json}
    python ppo_chain.py --gae-lambda 0 --output results-chain-lambda0
    python ppo_chain.py --gae-lambda 1 --output results-chain-lambda1
    python ppo_chain.py --steps 3 --output results-chain-smoke

The lambda runs change only the advantage estimator (0: one-step TD, 1: Monte Carlo) and write to their
own folders, so the three runs can be compared; --steps 3 checks the entry point only (no convergence).

The tree: from state 0, action 0 ("left") leads to state 1 and action 1 ("right") to state 2, with
reward 0. In state 1 the terminal rewards are [1, 0], in state 2 they are [0, 0.2]; every episode then
ends. The only way the first choice learns that left is better is credit assigned back through time:
GAE (rl_lab.gae) over a stream flattened episode-major, with a critic. The JSON keeps the first four
episodes of the first batch (`first_rollout_trace`) so the advantages can be checked by hand.

Shape notation (as in rl_lab.py): S states, A actions, E episodes per batch, T = 2E transitions.
"""

from __future__ import annotations

import argparse
import os
import sys

from lab.settings import SEED, SEED_LIMIT, STEPS, add_shared_argument
from lab.io import (
    OneLineErrorParser,
    csv_text,
    flags_first,
    float_flag,
    json_text,
    output_folder_or_exit,
    run_cli,
    write_files,
)

# ---------------------------------------------------------------------------------------------
# Command line: the flags first, so that --help and a bad flag answer before torch is loaded
# ---------------------------------------------------------------------------------------------

GAE_LAMBDA = 0.95


def build_parser():
    parser = OneLineErrorParser(
        prog="ppo_chain.py",
        description="Train PPO with a critic and GAE on a two-step decision tree whose only reward is terminal.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_shared_argument(parser, STEPS, 120)
    add_shared_argument(parser, SEED, 7)
    parser.add_argument("--gae-lambda", type=float_flag(0.0, 1.0), default=GAE_LAMBDA,
                        help="GAE lambda in [0, 1]: 0 = one-step TD advantages, 1 = Monte Carlo (gamma is 1)")
    parser.add_argument("--output", default="results-chain",
                        help="folder for ppo-chain.csv and ppo-chain.json (created if missing)")
    return parser


def parse(argv=None):
    """The flags, with the output checked before any work (a bad one exits 2 with one line)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    output_folder_or_exit(parser, args.output, ["ppo-chain.csv", "ppo-chain.json"])
    return args


if __name__ == "__main__":
    flags_first(parse)

# torch and the bandit's atoms after the flags: `import torch` takes a second or more, --help none of it
import torch
import torch.nn.functional as F

from lab.checks import check_int, check_real, check_tensor, dtype_name, torch_threads, training_mode
from rl_lab import DEVICE, DTYPE, MAX_STEPS, categorical_kl, clipped_policy_loss, gae, optimizer_step

# ---------------------------------------------------------------------------------------------
# Setup
# ---------------------------------------------------------------------------------------------

NUM_STATES = 3
NUM_ACTIONS = 2
START_STATE = 0
TRANSITIONS_PER_EPISODE = 2
EPISODES_PER_BATCH = 64
MAX_EPISODES = 1_000_000  # per rollout call: far above any use here, and well inside memory
GAMMA = 1.0  # undiscounted: the episode is two steps long, so the terminal reward counts in full
# The PPO hyperparameters equal the bandit's, restated here so that the chain's published reference
# does not move if the bandit is ever retuned.
LEARNING_RATE = 0.08
MAX_GRAD_NORM = 1.0
CLIP_EPSILON = 0.2
UPDATE_EPOCHS = 4
TARGET_OLD_POLICY_KL = 0.05
VALUE_COEF = 0.5

# (S, A) reward for taking action a in state s; state 0 pays nothing, so its credit must come through time
REWARDS = ((0.0, 0.0), (1.0, 0.0), (0.0, 0.2))
# state 0's action a leads to state NEXT_STATE[a]; states 1 and 2 are terminal after their action
NEXT_STATE = (1, 2)

COLUMNS = [
    "step", "optimizer_steps", "sampled_episodes", "sampled_transitions", "old_policy_kl", "expected_return",
    "left_probability", "left_success_probability", "value_start",
]
ROLLOUT_KEYS = ("states", "actions", "rewards", "values", "next_values", "old_logp", "terminated", "boundary")
TRACE_EPISODES = 4


def reward_table():
    """(S=3, A=2) float64 reward of taking action a in state s."""
    return torch.tensor(REWARDS, dtype=DTYPE, device=DEVICE)


def _check_tables(actor, critic):
    check_tensor("actor", actor, ndim=2)
    check_tensor("critic", critic, ndim=1)
    if tuple(actor.shape) != (NUM_STATES, NUM_ACTIONS):
        raise ValueError(f"actor: expected shape {(NUM_STATES, NUM_ACTIONS)}, got {tuple(actor.shape)}")
    if tuple(critic.shape) != (NUM_STATES,):
        raise ValueError(f"critic: expected shape {(NUM_STATES,)}, got {tuple(critic.shape)}")
    if critic.dtype != actor.dtype:
        raise ValueError(f"critic: expected dtype {actor.dtype} like actor, got {critic.dtype}")


def evaluate(actor, critic):
    """Exact evaluation of the (S, A) actor and (S,) critic by enumerating the four routes; no sampling.

    Returns a dict of floats: expected_return J = p(0|0) p(0|1) * 1 + p(1|0) p(1|2) * 0.2 (0.3 for the
    uniform policy, 1 at the optimum), left_probability p(0|0), left_success_probability p(0|1) and
    value_start V(0), the critic's estimate (it may briefly exceed 1: it is learned, not computed).
    Raises ValueError naming the argument for a non-tensor, non-finite or wrongly shaped table.
    """
    _check_tables(actor, critic)
    probs = F.softmax(actor.detach(), dim=-1)  # (S, A)
    rewards = reward_table().to(probs.dtype)
    second_states = torch.tensor(NEXT_STATE)  # (A,): where each first action leads
    # return expected after each first action: its own reward plus the second state's expected reward
    second_step = (probs[second_states] * rewards[second_states]).sum(dim=-1)  # (A, A) -> (A,)
    expected_return = (probs[START_STATE] * (rewards[START_STATE] + second_step)).sum()  # (A,) -> scalar
    return {
        "expected_return": expected_return.item(),
        "left_probability": probs[START_STATE, 0].item(),
        "left_success_probability": probs[NEXT_STATE[0], 0].item(),
        "value_start": critic.detach()[START_STATE].item(),
    }


def old_policy_kl(old_actor, actor, states):
    """Exact KL(old || current) in nats, averaged over the batch's visited states (repeats count).

    The early-stop statistic: it measures how far the update moved the policy on the states the batch
    actually holds, summed exactly over both actions (no sampled estimator).
    """
    kl_per_state = categorical_kl(old_actor, actor.detach())  # (S, A) -> (S,)
    return kl_per_state[states].mean().item()  # (S,) -> (T,) -> scalar


def _settings(steps, seed, gae_lambda):
    return {
        "seed": seed,
        "steps": steps,
        "gae_lambda": gae_lambda,
        "gamma": GAMMA,
        "episodes_per_batch": EPISODES_PER_BATCH,
        "transitions_per_episode": TRANSITIONS_PER_EPISODE,
        "learning_rate": LEARNING_RATE,
        "update_epochs": UPDATE_EPOCHS,
        "clip_epsilon": CLIP_EPSILON,
        "target_old_policy_kl": TARGET_OLD_POLICY_KL,
        "reference_kl": False,
        "advantage_normalization": False,
        "device": str(DEVICE),
        "dtype": dtype_name(DTYPE),
        "torch": torch.__version__,
        "optimizer": "Adam",
        "adam_betas": [0.9, 0.999],
        "max_grad_norm": MAX_GRAD_NORM,
        "value_coef": VALUE_COEF,
        "entropy_bonus": False,
        "value_clipping": False,
        "reward_table": [list(row) for row in REWARDS],
        "start_state_next_state": list(NEXT_STATE),
    }


# ---------------------------------------------------------------------------------------------
# Rollout
# ---------------------------------------------------------------------------------------------


def rollout(actor, critic, generator, episodes=EPISODES_PER_BATCH):
    """Sample `episodes` complete episodes from the (frozen) policy and flatten them episode-major.

    Sampling order (it fixes the random stream, hence the reference numbers): the first actions of all
    episodes in one `multinomial` call, then all second actions in a second call.
    Flattening is episode-major, e0t0, e0t1, e1t0, e1t1, ...: GAE runs backwards over one 1-D stream
    and stops only at a boundary, so each episode's two steps must be adjacent. Stacking all first
    steps and then all second steps would chain every first step to the wrong episode (the last first
    step would inherit episode 0's terminal reward, the one before it that step's advantage, ...).

    Args:
        actor: (S=3, A=2) float logits table; detached here (the old policy that sampled the batch).
        critic: (S=3,) float values; detached here (old values and bootstrap values stay fixed).
        generator: the run's torch.Generator, the only source of randomness.
        episodes: E >= 1.
    Returns:
        dict of (T = 2E,) tensors without grad: states, actions (int64), rewards, values = V(s_t),
        next_values = V(s_{t+1}) (V(second state) on step 0, 0 at the terminal), old_logp (nats),
        terminated and boundary (bool, [False, True] per episode: every episode truly ends).
    Raises:
        ValueError naming the argument for a bad tensor, shape, generator or episode count.
    """
    _check_tables(actor, critic)
    if not isinstance(generator, torch.Generator):
        raise ValueError(f"generator: expected a torch.Generator, got {type(generator).__name__}")
    episodes = check_int("episodes", episodes, low=1, high=MAX_EPISODES)
    old_logp_table = F.log_softmax(actor.detach(), dim=-1)  # (S, A)
    old_probs = old_logp_table.exp()
    old_values = critic.detach()
    rewards_table = reward_table().to(actor.dtype)
    next_state = torch.tensor(NEXT_STATE, dtype=torch.long)

    first_states = torch.full((episodes,), START_STATE, dtype=torch.long)  # (E,)
    first_actions = torch.multinomial(old_probs[first_states], 1, generator=generator).squeeze(1)  # (E, 1) -> (E,)
    second_states = next_state[first_actions]  # (E,)
    second_actions = torch.multinomial(old_probs[second_states], 1, generator=generator).squeeze(1)  # (E, 1) -> (E,)

    def episode_major(first, second):
        return torch.stack([first, second], dim=1).reshape(-1)  # (E,), (E,) -> (E, 2) -> (2E,) = e0t0, e0t1, ...

    states = episode_major(first_states, second_states)
    actions = episode_major(first_actions, second_actions)
    terminal_value = torch.zeros(episodes, dtype=actor.dtype)  # nothing follows a true terminal
    flags = torch.tensor([False, True]).repeat(episodes)  # (2,) -> (2E,): step 1 ends every episode
    return {
        "states": states,
        "actions": actions,
        "rewards": rewards_table[states, actions],
        "values": old_values[states],
        "next_values": episode_major(old_values[second_states], terminal_value),
        "old_logp": old_logp_table[states, actions],
        "terminated": flags,
        "boundary": flags.clone(),
    }


# ---------------------------------------------------------------------------------------------
# Advantages
# ---------------------------------------------------------------------------------------------


def advantages_and_returns(batch, gae_lambda=GAE_LAMBDA, gamma=GAMMA):
    """GAE over the episode-major stream of a `rollout` batch; returns (advantages, returns), (T,) each.

    With gamma = 1 and a zero critic, an episode ending in reward r gives A = r on its last step and
    A = lambda * r on its first: the first step earns nothing itself, it inherits lambda times its own
    episode's terminal reward through the trace (and later, as the critic learns, through the bootstrap
    V(second state), which is all it gets at lambda = 0). returns = advantages + old values are the
    lambda-returns the critic regresses on; they stay fixed for the whole batch.
    """
    if not isinstance(batch, dict) or any(key not in batch for key in ROLLOUT_KEYS):
        raise ValueError(f"batch: expected the dict of a rollout with keys {', '.join(ROLLOUT_KEYS)}")
    return gae(
        batch["rewards"], batch["values"], batch["next_values"], batch["terminated"], batch["boundary"],
        gamma=gamma, lam=gae_lambda,
    )


# ---------------------------------------------------------------------------------------------
# Update and record: the training loop
# ---------------------------------------------------------------------------------------------


def _row(step, optimizer_steps, kl, actor, critic):
    row = {
        "step": step, "optimizer_steps": optimizer_steps, "sampled_episodes": step * EPISODES_PER_BATCH,
        "sampled_transitions": step * EPISODES_PER_BATCH * TRANSITIONS_PER_EPISODE, "old_policy_kl": kl,
    }
    row.update(evaluate(actor, critic))
    return row


def _trace(batch, advantages, returns):
    """The first TRACE_EPISODES episodes (2 transitions each) of a batch as JSON-ready lists."""
    count = TRACE_EPISODES * TRANSITIONS_PER_EPISODE
    trace = {
        "reading": (
            "episode-major: entries 2e and 2e+1 are episode e's steps 0 and 1. With gamma = 1 and the zero "
            "initial critic, step 1 has advantage = its reward and step 0 has advantage = gae_lambda * that "
            "same reward (exactly gae_lambda for a reward of 1); terminated = boundary = true on step 1 stops "
            "the bootstrap and the trace, so no reward reaches the neighbouring episode. returns = advantages "
            "+ values (the lambda-returns)."
        ),
        "episode": [index // TRANSITIONS_PER_EPISODE for index in range(count)],
        "time_step": [index % TRANSITIONS_PER_EPISODE for index in range(count)],
    }
    for key in ROLLOUT_KEYS:
        trace[key] = batch[key][:count].tolist()
    trace["advantages"] = advantages[:count].tolist()
    trace["returns"] = returns[:count].tolist()
    return trace


@training_mode()  # the updates need autograd even under the caller's torch.no_grad() or inference_mode()
@torch_threads(1)  # tiny tensors: more threads only wait for each other (see rl_lab.torch_threads)
def train(*, steps=120, seed=7, gae_lambda=GAE_LAMBDA):
    """Train the chain with PPO, a critic and GAE; return (rows, report).

    rows: list of dicts with the CSV columns, row 0 = initial evaluation, then one per iteration
    (metrics after that iteration's updates).
    report: the JSON content: settings, initial, final, first_rollout_trace, final_action_probabilities.
    Raises ValueError naming the argument for a non-int (or bool) steps/seed, a value out of range, or
    a gae_lambda outside [0, 1] or not finite.
    """
    steps = check_int("steps", steps, low=1, high=MAX_STEPS)
    seed = check_int("seed", seed, low=0, high=SEED_LIMIT - 1)
    gae_lambda = check_real("gae_lambda", gae_lambda, low=0.0, high=1.0)

    # setup
    generator = torch.Generator(device=DEVICE).manual_seed(seed)  # the one seeding point of the run
    actor = torch.zeros(NUM_STATES, NUM_ACTIONS, dtype=DTYPE, device=DEVICE, requires_grad=True)  # uniform start
    critic = torch.zeros(NUM_STATES, dtype=DTYPE, device=DEVICE, requires_grad=True)  # V(s) = 0 at start
    params = [actor, critic]
    optimizer = torch.optim.Adam(params, lr=LEARNING_RATE)
    rows = [_row(0, 0, 0.0, actor, critic)]
    optimizer_steps = 0
    first_rollout_trace = None  # filled from the first batch, before any update
    for step in range(1, steps + 1):
        # rollout: 64 whole episodes from the frozen old policy, flattened episode-major
        old_actor = actor.detach().clone()
        batch = rollout(old_actor, critic, generator, EPISODES_PER_BATCH)
        states, actions = batch["states"], batch["actions"]
        # advantages: GAE over the stream, so the unrewarded first step gets credit from its own episode's
        # terminal reward (trace) and from V(second state) (bootstrap); both are fixed for the batch
        advantages, returns = advantages_and_returns(batch, gae_lambda)
        if step == 1:
            first_rollout_trace = _trace(batch, advantages, returns)
        # update: up to UPDATE_EPOCHS full-batch steps, stopped once the policy drifted from old
        for _ in range(UPDATE_EPOCHS):
            if old_policy_kl(old_actor, actor, states) > TARGET_OLD_POLICY_KL:
                break
            logp = F.log_softmax(actor, dim=-1)[states, actions]  # (S, A) -> (T,)
            policy_loss = clipped_policy_loss(logp, batch["old_logp"], advantages, CLIP_EPSILON).mean()
            # the lambda-returns were computed from the old critic: a fixed regression target, not a moving one
            value_loss = (critic[states] - returns).square().mean()  # (S,) -> (T,) -> scalar
            loss = policy_loss + VALUE_COEF * value_loss
            optimizer_step(optimizer, params, loss, MAX_GRAD_NORM)  # one norm over actor and critic together
            optimizer_steps += 1
        # record: metrics after this iteration's updates; old_policy_kl is the early-stop statistic at the end
        rows.append(_row(step, optimizer_steps, old_policy_kl(old_actor, actor, states), actor, critic))

    report = {
        "settings": _settings(steps, seed, gae_lambda),
        "initial": rows[0],
        "final": rows[-1],
        "first_rollout_trace": first_rollout_trace,
        "final_action_probabilities": F.softmax(actor.detach(), dim=-1).tolist(),  # (S, A), rows = states
    }
    return rows, report


# ---------------------------------------------------------------------------------------------
# Write (command line)
# ---------------------------------------------------------------------------------------------


def main(argv=None):
    args = parse(argv)
    rows, report = train(steps=args.steps, seed=args.seed, gae_lambda=args.gae_lambda)
    csv_path = os.path.join(args.output, "ppo-chain.csv")
    json_path = os.path.join(args.output, "ppo-chain.json")
    write_files({csv_path: csv_text(rows, COLUMNS), json_path: json_text(report)})  # both or neither
    first, last = rows[0], rows[-1]
    print(
        f"ppo-chain expected_return {first['expected_return']:.4f} -> {last['expected_return']:.4f}  "
        f"left_probability {last['left_probability']:.4f}  value_start {last['value_start']:.4f}  "
        f"optimizer_steps {last['optimizer_steps']}  -> {csv_path}, {json_path}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
