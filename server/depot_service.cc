// placeholder: replaced by the server implementation
