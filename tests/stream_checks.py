"""Checks of a streamed request's trace (lablib.engines.http.trace.HTTPTrace) that hold on a busy machine too."""


def decode_timed(t) -> bool:
    """``t.tpot_s > 0``, or every token arrived in the first token's network read, as the trace's reads say.

    The lab stamps a token when the read that carries it returns (before parsing): a client late to read (two cores
    busy with other tests) finds the whole stream in one read, and then every token has one stamp, as observed (CI:
    6 tokens of a llama-server on one thread, all at +0.207 s): no decode seen, no TPOT (``decode_unseen``). A
    stamping bug (tokens stamped at the end, say) gives equal stamps from several reads, and this is False."""
    if t.tpot_s is not None and t.tpot_s > 0:
        return True
    return t.tpot_s is None and t.decode_unseen and t.max_events_per_read >= t.output_tokens
