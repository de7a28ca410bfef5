"""`agent.on_context_full: truncate_observation`: an observation after which the next turn would not fit is cut in
its middle, keeping its head and tail around a marker that says how many tokens went, so the episode goes on."""

from collections.abc import Callable

MARKER = "\n[... {cut} tokens of this output were cut to fit the context ...]\n"
_TRIES = 4  # re-tokenising the joined text can merge a token or two at the cuts; each try removes the overshoot


def cut_to_fit(tokenizer, text: str, segment_of: Callable[[str], list[int]],
               limit: int) -> tuple[str, list[int], int]:
    """(text, its prompt segment, tokens cut): `text` cut until `segment_of(text)` has at most `limit` ids.

    Unchanged, with 0 cut, when it fits already or when not even two of its tokens and the marker would fit (the
    context limit then ends the episode as before).
    """
    segment = segment_of(text)
    ids = tokenizer.encode(text, add_special_tokens=False)
    marker = len(tokenizer.encode(MARKER.format(cut=len(ids)), add_special_tokens=False))
    cut, fitted, fitted_segment = 0, text, segment
    for attempt in range(_TRIES + 1):
        over = len(fitted_segment) - limit
        if over <= 0:
            return fitted, fitted_segment, cut
        if attempt == _TRIES:
            break
        cut = min(cut + over + (0 if cut else marker), len(ids))
        keep = len(ids) - cut
        if keep < 2:
            break
        head, tail = ids[:keep // 2], ids[len(ids) - (keep - keep // 2):]
        fitted = (tokenizer.decode(head, skip_special_tokens=False) + MARKER.format(cut=cut)
                  + tokenizer.decode(tail, skip_special_tokens=False))
        fitted_segment = segment_of(fitted)
    return text, segment, 0
