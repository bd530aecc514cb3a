// placeholder: replaced by the client implementation
