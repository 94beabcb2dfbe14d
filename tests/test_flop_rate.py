"""benchmarks/flop_rate.py's counts on a compiled program: each loop's body times its trip count."""
import jax
import jax.numpy as jnp

from benchmarks import flop_rate


def test_a_loop_body_counts_once_per_iteration():
    x, w = jnp.ones((4, 8)), jnp.ones((8, 8)) / 8

    def loop(trips):
        # A scan of `trips` products, with an unknown input, so that XLA neither folds nor unrolls it.
        return lambda x, w: jax.lax.scan(lambda x, _: (jnp.tanh(x @ w), None), x, None, length=trips)[0]

    counts = {}
    for trips in (3, 7):
        compiled = jax.jit(loop(trips)).lower(x, w).compile()
        assert flop_rate.hlo_dot_flops(compiled) == trips * 2 * 4 * 8 * 8
        counts[trips] = flop_rate.hlo_op_counts(compiled)
        assert not {"parameter", "constant", "tuple", "get-tuple-element", "bitcast"} & set(counts[trips])
        assert counts[trips]["while"] <= 1
    # The body (the product, a dot or on newer jax a library fusion; its tanh; the loop counter and
    # test) runs once per iteration, the rest once: the count grows by the same amount per iteration.
    grown = sum(counts[7].values()) - sum(counts[3].values())
    per_iteration = grown // 4
    assert grown == 4 * per_iteration and per_iteration >= 3
    assert sum(counts[3].values()) >= 3 * per_iteration
