"""The wire: codecs of our service and libtpu's, the fast encoder, bounded decoding
(the protos are in tpu_info/proto)."""
