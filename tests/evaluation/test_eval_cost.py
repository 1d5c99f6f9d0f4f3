"""What `retrofit eval` says it will cost, said before the long work starts (a user's report: "444.0 ms a pass +
64,000,000,000 tokens/s ... at least 8 min" for what took 5 min; SmolLM2 said nothing in 150 s; an encoder
nothing at all), and a budget that fits the model it is given (``budget_windows``, which --quick sets).

A fake clock stands for the machine: every forward advances it by what the test says, so the estimate is
checked exactly and nothing is timed for real."""

from __future__ import annotations

import logging
import re
import time

import pytest

from retrofit.evaluation import cost, evaluate
from retrofit.evaluation.options import QUICK, eval_options, fitted_budget

from .test_eval_common import byte_tokenizer, docs, tiny_gpt2, tiny_llama


class Clock:
    """``time.perf_counter`` for the test: a forward of ``n`` tokens takes ``per_pass + per_token * n`` seconds."""

    def __init__(self, per_pass: float, per_token: float):
        self.now, self.per_pass, self.per_token, self.forwards = 0.0, per_pass, per_token, 0

    def __call__(self) -> float:
        return self.now

    def forward(self, module, args, kwargs):
        ids = kwargs.get("input_ids") if kwargs.get("input_ids") is not None else args[0]
        self.forwards += 1
        self.now += self.per_pass + self.per_token * ids.shape[-1]


class Said(logging.Handler):
    """Each cost line as it is logged, with the forwards done and the clock's time then."""

    def __init__(self, clock: Clock):
        super().__init__(logging.INFO)
        self.clock, self.lines = clock, []

    def emit(self, record):
        text = record.getMessage()
        if text.startswith("cost:"):
            self.lines.append((text, self.clock.forwards, self.clock.now))


@pytest.fixture
def clocked(monkeypatch):
    """``clocked(model, per_pass, per_token)`` -> the Said handler of an evaluation on that fake machine."""

    def make(model, per_pass: float, per_token: float) -> Said:
        clock = Clock(per_pass, per_token)
        model.register_forward_pre_hook(clock.forward, with_kwargs=True)
        monkeypatch.setattr(time, "perf_counter", clock)
        said = Said(clock)
        logger = logging.getLogger("retrofit.evaluation.runner")
        monkeypatch.setattr(logger, "level", logging.INFO)
        logger.addHandler(said)
        monkeypatch.setattr(logger, "handlers", [*logger.handlers])  # put back after the test
        return said

    return make


def _numbers(pattern: str, text: str) -> list[float]:
    """Every number the pattern's groups match, in order."""
    found = re.findall(pattern, text)
    return [float(x.replace(",", "")) for m in found for x in (m if isinstance(m, tuple) else (m,))]


def test_the_cost_is_said_before_any_forward_and_a_pass_that_costs_the_same_at_every_length_is_no_absurd_rate(
    clocked,
):
    """The user's tiny model: a pass costs about the same at every length (fixed cost), which a cost per token
    fitted on two short inputs turned into billions of tokens per second."""
    model, tok = tiny_gpt2(n_positions=64), byte_tokenizer()
    said = clocked(model, per_pass=0.444, per_token=0.0)
    evaluate(model, [16, 32, 64], data=docs(), tokenizer=tok, budget=256, progress=False)
    (plan, forwards_then, _), (timed, *_) = said.lines
    assert forwards_then == 0  # said at once, before anything is timed or scored
    tokens, passes = _numbers(r"([\d,]+) tokens through the models in ([\d,]+) forward passes", plan)[:2]
    assert tokens > passes > 0
    assert f"about {passes * 0.444:.0f} s" in timed, timed  # every pass costs 0.444 s here, whatever its length
    longest = max(_numbers(r"windows of [\d,]+ to ([\d,]+) tokens", plan))
    rates = _numbers(r"([\d,]+) tokens/s", timed)
    assert rates and max(rates) <= longest / 0.444, timed  # what was measured, never past what a pass can do
    assert "64 tokens in 444.0 ms" in timed, timed  # measured up to the longest window the model runs


def test_timing_a_slow_model_stops_after_a_few_seconds_and_says_what_it_extrapolates(clocked):
    """SmolLM2 on a CPU (tens of tokens/s): timing forwards at the eval's lengths would take minutes before the
    cost is said; the timing stops growing once a forward takes about TIMING_S / 2."""
    model, tok = tiny_llama(max_len=64), byte_tokenizer()
    said = clocked(model, per_pass=0.1, per_token=0.05)
    evaluate(model, [64, 128], data=docs(), tokenizer=tok, budget=256, progress=False, copy=False)
    (_, _, start), (timed, _, end) = said.lines
    assert end - start <= 2 * cost.TIMING_S  # fake seconds: the forwards the estimate timed
    assert "extrapolated" in timed and "up to 128 tokens" in timed, timed


def test_pass_seconds_reads_between_and_past_the_timed_forwards():
    timed = [(16, 1.0), (32, 0.9), (64, 2.0)]  # the 32-token forward looked quicker: noise, taken as 1.0
    assert cost.pass_seconds(8, timed) == 1.0
    assert cost.pass_seconds(32, timed) == 1.0
    assert cost.pass_seconds(48, timed) == pytest.approx(1.5)
    assert cost.pass_seconds(128, timed) == pytest.approx(2.0 + 64 / 32)  # the last slope, on
    assert cost.pass_seconds(32, [(16, 0.5)]) == pytest.approx(1.0)  # one forward: in proportion past it
    assert cost.estimate([(16, 3), (128, 2)], timed) == pytest.approx(3 * 1.0 + 2 * 4.0)


def test_an_encoder_says_its_cost_too(clocked):
    import copy

    from transformers import BertConfig, BertForMaskedLM

    tok = copy.deepcopy(byte_tokenizer())
    tok.add_special_tokens({"mask_token": "<mask>"})
    model = BertForMaskedLM(
        BertConfig(
            vocab_size=260,
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=64,
        )
    ).eval()
    said = clocked(model, per_pass=0.01, per_token=0.0)
    evaluate(model, [32, 64], data=docs(), tokenizer=tok, budget=128, progress=False, copy=False)
    assert [forwards for _, forwards, _ in said.lines][:1] == [0] and len(said.lines) == 2, said.lines
    assert "tokens through the models" in said.lines[0][0] and "here for the forwards" in said.lines[1][0]


def test_the_budget_grows_to_two_windows_of_the_longest_length():
    """--quick's 8,192 tokens are one window at SmolLM2's 2x (16,384): no interval. Its budget fits the model."""
    assert QUICK["budget_windows"] == 2
    quick = eval_options(**QUICK)
    assert fitted_budget(quick, 16_384).budget == 32_768
    assert fitted_budget(quick, 256).budget == 8_192  # a small model keeps the preset's budget
    assert fitted_budget(eval_options(budget=100), 64).budget == 100  # unset: the budget as given
    model, tok = tiny_llama(max_len=64), byte_tokenizer()
    report = evaluate(
        model, [64, 128], data=docs(), tokenizer=tok, budget=64, budget_windows=2, progress=False, copy=False
    )
    assert report.data["data"]["budget"] == 256
    assert {r["windows"] for r in report.rows if r["length"] == 128 and r["method"] == "non-overlapping"} == {2}


def test_the_cost_line_suggests_quick_only_when_the_evaluation_is_not_already_quick(clocked):
    model, tok = tiny_gpt2(n_positions=64), byte_tokenizer()
    said = clocked(model, per_pass=0.01, per_token=0.0)
    evaluate(model, [16, 32], data=docs(), tokenizer=tok, budget=256, progress=False, copy=False)
    assert "lighter: retrofit eval --quick" in said.lines[-1][0]
    evaluate(
        model,
        [16, 32],
        data=docs(),
        tokenizer=tok,
        progress=False,
        **{k: v for k, v in QUICK.items() if k != "lengths"},
    )
    assert "cost: about" in said.lines[-1][0] and "--quick" not in said.lines[-1][0], said.lines[-1][0]


def test_a_cost_under_a_second_is_said_so_never_about_0_s():
    assert cost.when(0.2) == "under a second"
    assert (cost.when(42), cost.when(600), cost.when(9000)) == ("about 42 s", "about 10 min", "about 2.5 h")
