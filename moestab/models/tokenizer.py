"""A character-level tokenizer built in code: a real ``PreTrainedTokenizerFast``, no download.

Each character of ``CHARSET`` is one token; text outside it maps to ``<unk>``. Saved with
``save_pretrained``, it loads back with ``AutoTokenizer.from_pretrained`` without moestab.
"""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedModel, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from moestab.charset import CHARSET

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)


def build_char_tokenizer(charset: str = CHARSET) -> PreTrainedTokenizerFast:
    """Return a character-level fast tokenizer over ``charset`` plus the four special tokens.

    Token ids: ``<pad>``=0, ``<bos>``=1, ``<eos>``=2, ``<unk>``=3, then ``charset`` in order.
    """
    if len(set(charset)) != len(charset):
        raise ValueError("charset has repeated characters")
    vocab = {tok: i for i, tok in enumerate((*SPECIAL_TOKENS, *charset))}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("(?m)."), behavior="isolated")
    backend.decoder = decoders.Fuse()  # join characters back without spaces
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        padding_side="left",  # decoder-only generation pads on the left
        clean_up_tokenization_spaces=False,
    )


def tokenizer_overflow(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> str | None:
    """Why ``tokenizer`` cannot feed ``model``: it has more tokens than the model's input embedding has rows, so
    its last ids would index past the table (an IndexError on CPU, a device assert on a GPU, mid-run). None when it
    fits; an embedding with spare rows (padding to a multiple) fits."""
    rows = model.get_input_embeddings().num_embeddings
    if len(tokenizer) > rows:
        return (f"its tokenizer has {len(tokenizer):,} tokens but the model's embedding has {rows:,} rows (ids "
                f"{rows:,}-{len(tokenizer) - 1:,} have none); resize the embedding (resize_token_embeddings) or use "
                "the model's own tokenizer")
    return None
