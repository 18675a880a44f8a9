"""The Textual dashboard behind ``tpu-info --watch`` (see its issue).

Not built yet: importing it is cheap and safe.
"""
