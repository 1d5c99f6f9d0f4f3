"""Layer 3: the data a fine-tune or an evaluation reads: data specs to documents and records (``specs``: built-in
corpora, files, Hub datasets, streamed or whole) and the offline long-document tasks (``longdoc``); above ``models``
(the bundled assets, the Hub cache), which never imports it."""
