"""Raw token bytes for logprobs: byte-level BPE, SentencePiece byte fallback, added tokens."""

from __future__ import annotations

from tokenizers import AddedToken, decoders
from tokenizers import Tokenizer as BackendTokenizer
from tokenizers.models import BPE

from stagewise.engine.generation_request import TokenEvent
from stagewise.engine.request import EngineRequest
from stagewise.engine.sampling import Sample
from stagewise.engine.sequence_output import SequenceOutput
from stagewise.engine.tokenizer import Tokenizer
from stagewise.weights.tokenizer_train import train_demo_tokenizer


def _demo() -> Tokenizer:
    return Tokenizer(train_demo_tokenizer(420, pad_to=448), eos_token_id=2)


def test_byte_level_tokens_are_their_own_bytes() -> None:
    tok = _demo()
    ids = tok.encode("café 日本 🙂 Hello")
    joined = b"".join(tok.token_bytes(i) for i in ids)
    assert joined == "café 日本 🙂 Hello".encode()
    lone = [i for i in range(tok.vocab_size) if len(tok.token_bytes(i)) == 1 and tok.token_bytes(i)[0] >= 0x80]
    assert len(lone) >= 64  # the byte alphabet's upper half
    assert tok.decode([lone[0]]) == "\ufffd" and tok.token_bytes(lone[0]) != "\ufffd".encode()
    assert tok.token_bytes(tok.encode(" the")[0]) == b" the"
    assert tok.token_bytes(2) == b"<|im_end|>"  # special: its text
    assert tok.token_bytes(10**6) == b""


def test_sentencepiece_byte_fallback() -> None:
    vocab = {"<unk>": 0, "<0xC3>": 1, "<0xA9>": 2, "▁caf": 3, "e": 4}
    backend = BackendTokenizer(BPE(vocab, [], unk_token="<unk>", byte_fallback=True))
    backend.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    backend.add_special_tokens([AddedToken("</s>", special=True)])
    tok = Tokenizer(backend)
    assert [tok.token_bytes(i) for i in (1, 2, 3, 4)] == [b"\xc3", b"\xa9", b" caf", b"e"]
    assert tok.token_bytes(5) == b"</s>"


def test_logprobs_carry_token_bytes() -> None:
    tok = _demo()
    ids = [tok.token_to_id("Ã"), tok.token_to_id("©")]  # bytes 0xC3 and 0xA9 in GPT-2's byte alphabet: "é"
    assert None not in ids
    request = EngineRequest("r", (1,), 4, logprobs=True, top_logprobs=1)
    out = SequenceOutput(request, tok)
    entries = []
    for index, token in enumerate(ids):
        assert token is not None
        entries += out.add(TokenEvent(index, Sample(token, -0.1, ((token, -0.1),)))).logprobs
    assert [e.bytes for e in entries] == [(0xC3,), (0xA9,)]
    assert [e.top[0][2] for e in entries] == [(0xC3,), (0xA9,)]
    assert bytes(b for e in entries for b in e.bytes).decode() == "é"
