# Digests and a symmetric round trip with a fixed key and IV.
set -eu
key=000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f
iv=0f0e0d0c0b0a09080706050403020100
openssl dgst -sha256 data.txt
openssl dgst -sha512 -r data.txt
openssl enc -aes-256-cbc -K "$key" -iv "$iv" -in data.txt -out data.enc
openssl dgst -sha256 -r data.enc
openssl enc -d -aes-256-cbc -K "$key" -iv "$iv" -in data.enc -out data.dec
cmp data.txt data.dec && echo "aes round trip ok"
openssl enc -chacha20 -K "$key" -iv "${iv}" -in data.txt | openssl dgst -sha256 -r
openssl base64 -in data.enc -out data.b64
head -n 3 data.b64
openssl dgst -sha256 -hmac secret -r data.txt
echo "all steps done"
