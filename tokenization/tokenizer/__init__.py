"""From text to token ids: the tokenizer file and its conversions (``loading``, ``conversion``), the ids a run puts
around each document (``policy``), the engines (``engines``, ``fast_engine``), exact cuts of long texts
(``cutting``), loss bytes (``loss_masks``), documents encoded as the stages write them (``encoding``,
``documents``) and the key of a file's first pass in the cache (``cache_key``). Never imports the output protocol.
"""
