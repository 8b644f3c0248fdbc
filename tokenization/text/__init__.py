"""From input files to token ids: reading records (``sources``), rendering templates and chats (``rendering``, in
the bounded ``sandbox``), the tokenizer and its policy (``tokenizer_files``, ``encoding_policy``), the engines
(``engines``, ``fast_engine``), cutting long texts (``cutting``), loss masks (``loss_masks``), and the batches
the stages take (``encoding``, ``documents``).
"""
