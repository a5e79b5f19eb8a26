"""Questions in: the question record every stage reads, the dataset loaders, and question-set
specs as users type them (``gsm8k_test:10,my.jsonl``).
"""
